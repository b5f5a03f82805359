// Package workspace_test checks BashWorkspaces end to end in one process
// (internal/rig/testrig: a real kube-apiserver and etcd, the controller, and
// real agents at the tenant isolation level, which workspaces need): a
// workspace made on its node, tasks that run in it, the GitOps order, the
// owner rule, deletion while a task runs, the idle timeout, a lost node,
// and images (a pull's progress, its failures, the digest a workspace
// keeps).
package workspace_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testrig"
)

// agentLostAfter is short so that the node-loss test is quick.
const agentLostAfter = 3 * time.Second

var (
	rig *testrig.Rig
	k8s client.Client
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "workspace tests: skipped, the tenant isolation level needs root")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	opts := controllers.DefaultOptions()
	opts.AgentLostAfter = agentLostAfter
	opts.RetryInterval = 500 * time.Millisecond
	opts.ProgressInterval = 500 * time.Millisecond
	// Workspaces that run a task are read every second; quiet ones keep
	// the default --workspace-idle-refresh-interval (minutes), so that a
	// lost agent or Node is seen through the events that reconcile its
	// workspaces, not through a read that happens to come.
	opts.WorkspaceRefreshInterval = time.Second
	var err error
	rig, err = testrig.Start(testrig.Options{
		// node-c is for the agent-loss test, node-d for the Node-deletion
		// test: both end up lost.
		Agents: []localcluster.Agent{
			{Node: "node-a", IP: "127.0.0.2", Labels: map[string]string{"zone": "a"}},
			{Node: "node-b", IP: "127.0.0.3", Labels: map[string]string{"zone": "b"}},
			{Node: "node-c", IP: "127.0.0.4", Labels: map[string]string{"zone": "c"}},
			{Node: "node-d", IP: "127.0.0.5", Labels: map[string]string{"zone": "d"}},
		},
		Controller:   &opts,
		Unary:        imageRequests.unary,
		Tenant:       true,
		SharedBucket: true,
		// Where the host allows it, every workspace is a file system of
		// its own (64 MiB unless its spec.storage says otherwise, at most
		// 256 MiB).
		TaskDiskBytes: 64 << 20,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test rig:", err)
		return 1
	}
	k8s = rig.Client
	code := m.Run()
	// Workspaces are file systems mounted on the host: the controller
	// removes what the tests left before the rig goes.
	deleteAllWorkspaces()
	rig.Stop()
	return code
}

// deleteAllWorkspaces deletes every workspace and waits up to 30 s for the
// controller to have removed them from their nodes.
func deleteAllWorkspaces() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var list v1.BashWorkspaceList
	if err := k8s.List(ctx, &list); err != nil {
		fmt.Fprintln(os.Stderr, "workspace tests: listing workspaces:", err)
		return
	}
	for i := range list.Items {
		_ = k8s.Delete(ctx, &list.Items[i])
	}
	for ctx.Err() == nil {
		if err := k8s.List(ctx, &list); err == nil && len(list.Items) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "workspace tests: %d workspaces still there after 30 s\n", len(list.Items))
}

// ctxBackground is the context of polls inside Eventually, which outlive no
// test.
func ctxBackground() context.Context { return context.Background() }
