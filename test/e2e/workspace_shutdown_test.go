package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

// SIGTERM to the agent process that holds a workspace (a DaemonSet
// rollout, a node shutdown) moves the workspace before the agent exits:
// it is snapshotted to the S3 bucket and released, the agent exits as
// soon as that is done (well within its --shutdown-workspace-timeout of
// 30 s, and before the controller's 30 s workspace refresh: the
// controller heard of the drain on the Watch stream), and the next task
// restores it on the other node with every file written before.
func TestAgentSIGTERMMovesWorkspace(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	ws := createWorkspace(t, ns, "moves", "--owner", "o1", "--network", "None")
	first := ptr.Deref(ws.Status.NodeName, "")
	if first == "" {
		t.Fatalf("workspace status %+v: no node", ws.Status)
	}
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "moves", "--owner", "o1", "--", cmd)
		if code != 0 {
			t.Fatalf("run %q: exit %d\nstdout: %s\nstderr: %s", cmd, code, out, errOut)
		}
		return out
	}
	sum := run(`head -c 8388608 /dev/urandom > data && mkdir -p src && echo before-the-stop > src/f && sha256sum data`)
	wrote := time.Now()

	// The agent stays down once it exits, as on a node being shut down;
	// the launcher would start it again otherwise.
	name := "agent-" + first
	hold := localcluster.HoldPath(clusterDir, name)
	if err := os.MkdirAll(filepath.Dir(hold), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pid := componentPid(t, name)
	t.Cleanup(func() { releaseAgent(t, name, pid) })
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to %s (pid %d): %v", name, pid, err)
	}
	signalled := time.Now()
	for syscall.Kill(pid, 0) == nil {
		if time.Since(signalled) > time.Minute {
			t.Fatalf("%s (pid %d) still runs a minute after SIGTERM", name, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	exited := time.Since(signalled)
	t.Logf("%s exited %v after SIGTERM", name, exited.Round(time.Millisecond))
	if exited > 20*time.Second {
		t.Errorf("%s took %v to exit: the drain waited past the workspace's move", name, exited)
	}
	log, err := os.ReadFile(filepath.Join(clusterDir, "logs", name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "msg=drained moved=1 ") {
		t.Errorf("%s's log has no drain that moved one workspace:\n%s", name, tail(string(log), 20))
	}

	var got v1.BashWorkspace
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "moves"}, &got); err != nil {
		t.Fatal(err)
	}
	snap := got.Status.Snapshot
	switch {
	case ptr.Deref(got.Status.Phase, "") != v1.WorkspaceSuspended || got.Status.NodeName != nil:
		t.Fatalf("after the agent exited: phase %v, node %v (%s); want Suspended and released",
			ptr.Deref(got.Status.Phase, ""), ptr.Deref(got.Status.NodeName, ""), ptr.Deref(got.Status.Message, ""))
	case snap == nil || snap.Time == nil:
		t.Fatalf("no snapshot in the status: %+v", got.Status)
	case snap.Time.Time.Before(wrote.Truncate(time.Second)):
		t.Errorf("the snapshot of %v is older than the files, written by %v", snap.Time.Time, wrote)
	}

	out := run(`sha256sum data; cat src/f`)
	if want := sum + "before-the-stop\n"; out != want {
		t.Errorf("after the move:\n%s\nwant:\n%s", out, want)
	}
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "moves"}, &got); err != nil {
		t.Fatal(err)
	}
	if node := ptr.Deref(got.Status.NodeName, ""); node == first || node == "" || got.Status.RestoredFrom == nil {
		t.Errorf("restored on node %q from %+v; want the other node, from the snapshot", node, got.Status.RestoredFrom)
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
