package controllers_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testrig"
)

const (
	// agentLostAfter is short so that the agent-loss test is quick.
	agentLostAfter = 3 * time.Second
	// maxRunningPerOwner applies to tasks that set spec.owner.
	maxRunningPerOwner = 1
	// toleratedTaint is the key of a NoSchedule taint the agents'
	// configured tolerations tolerate.
	toleratedTaint = "bashtask.dev/test-tolerated"
	// turnsNode runs at most turnsCapacity tasks, for the fair turns.
	turnsNode     = "node-e"
	turnsCapacity = 2
)

var (
	rig *testrig.Rig
	k8s client.Client
)

func TestMain(m *testing.M) {
	opts := controllers.DefaultOptions()
	opts.AgentLostAfter = agentLostAfter
	opts.MaxRunningPerOwner = maxRunningPerOwner
	opts.ProgressInterval = 500 * time.Millisecond
	opts.RetryInterval = 500 * time.Millisecond
	opts.AgentTolerations = []corev1.Toleration{{Key: toleratedTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	var err error
	rig, err = testrig.Start(testrig.Options{
		// node-c is reserved for the agent-loss test, node-d for the
		// tests of the node's scheduling state (cordon, taints, Ready),
		// node-e (two task slots) for the test of the fair turns.
		Agents: []localcluster.Agent{
			{Node: "node-a", IP: "127.0.0.2", Labels: map[string]string{"zone": "a"}},
			{Node: "node-b", IP: "127.0.0.3", Labels: map[string]string{"zone": "b"}},
			{Node: "node-c", IP: "127.0.0.4", Labels: map[string]string{"zone": "c"}},
			{Node: "node-d", IP: "127.0.0.5", Labels: map[string]string{"zone": "d"}},
			{Node: turnsNode, IP: "127.0.0.6", Labels: map[string]string{"zone": "e"}},
		},
		AgentCapacities: map[string]int{turnsNode: turnsCapacity},
		Controller:      &opts,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test rig:", err)
		os.Exit(1)
	}
	k8s = rig.Client
	code := m.Run()
	rig.Stop()
	os.Exit(code)
}

// ctxBackground is the context of polls inside Eventually, which outlive no
// test.
func ctxBackground() context.Context { return context.Background() }
