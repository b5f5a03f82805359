// Package reliability_test checks the system's limits and failure handling
// end to end in one process (internal/rig/testrig: a real kube-apiserver and
// etcd, agents over mTLS, the controller): reports that stay bounded with
// many tasks holding full tails, and leader fencing.
package reliability_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testrig"
)

// manyTasks is how many tasks TestFullTailsSurviveRestart runs on one agent.
const manyTasks = 150

var (
	rig *testrig.Rig
	k8s client.Client
)

func TestMain(m *testing.M) {
	opts := controllers.DefaultOptions()
	opts.RetryInterval = 500 * time.Millisecond
	var err error
	rig, err = testrig.Start(testrig.Options{
		Agents:        []localcluster.Agent{{Node: "node-a", IP: "127.0.0.2"}},
		Controller:    &opts,
		AgentCapacity: manyTasks + 10,
		Workers:       8,
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
