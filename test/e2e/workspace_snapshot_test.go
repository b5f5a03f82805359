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
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// The plugin's snapshot, suspend and resume of a workspace of 100 MiB
// through the local cluster's S3 bucket: the files come back after the
// suspend, and get shows the phase and the snapshot's age. It logs how
// long the resume took until the first task had started (the figure of
// docs/workspaces.md).
func TestPluginWorkspaceSnapshotSuspendResume(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "snap", "--owner", "o1", "--network", "None")
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "snap", "--owner", "o1", "--", cmd)
		if code != 0 {
			t.Fatalf("run %q: exit %d\nstdout: %s\nstderr: %s", cmd, code, out, errOut)
		}
		return out
	}
	sum := run(`head -c 104857600 /dev/urandom > data && mkdir -p src/empty && echo hi > src/a && ln -s a src/link && sha256sum data`)

	out, errOut, code := plugin(t.Context(), "", "-n", ns, "workspace", "snapshot", "snap")
	if code != 0 || !strings.Contains(out, "snapshot of") {
		t.Fatalf("workspace snapshot: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	out, errOut, code = plugin(t.Context(), "", "-n", ns, "workspace", "suspend", "snap")
	if code != 0 || !strings.Contains(out, "suspended") {
		t.Fatalf("workspace suspend: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	out, _, _ = plugin(t.Context(), "", "-n", ns, "workspace", "get", "snap")
	if !strings.Contains(out, "Suspended") || !strings.Contains(out, "ago") {
		t.Errorf("workspace get of a suspended workspace:\n%s", out)
	}

	start := time.Now()
	out, errOut, code = plugin(t.Context(), "", "-n", ns, "workspace", "resume", "snap")
	if code != 0 || !strings.Contains(out, "ready on") {
		t.Fatalf("workspace resume: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	got := run(`sha256sum data; cat src/a; readlink src/link; ls -d src/empty`)
	t.Logf("resume of a 100 MiB workspace until its first task ended: %v", time.Since(start).Round(time.Millisecond))
	if want := sum + "hi\na\nsrc/empty\n"; got != want {
		t.Errorf("after the resume:\n%s\nwant:\n%s", got, want)
	}
}

// A node lost with its state directory (the agent killed, its state
// removed, as when a node's disk goes): the workspace comes back from its
// last snapshot, and the first task on the restored copy carries the
// notice (status.workspaceRestore, and the plugin's get prints it) naming
// the lost node and how old the snapshot was; the files written after
// the snapshot are gone, and the next task carries no notice.
func TestWorkspaceRestoreNoticeAfterNodeLoss(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	ws := createWorkspace(t, ns, "lost", "--owner", "o1", "--network", "None", "--snapshot-after-task", "0")
	node := ptr.Deref(ws.Status.NodeName, "")
	inWS := func(bt *v1.BashTask) { bt.Spec.Workspace, bt.Spec.Owner = ptr.To("lost"), ptr.To("o1") }
	runTask := func(name, command string) *v1.BashTask {
		t.Helper()
		createTask(t, ns, name, command, inWS)
		bt := testutil.WaitTerminal(t, k8s, ns, []string{name}, 2*time.Minute)[name]
		if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded {
			t.Fatalf("%s: %s %s", name, ptr.Deref(bt.Status.Reason, ""), ptr.Deref(bt.Status.Message, ""))
		}
		return bt
	}
	runTask("before", "echo kept > f")
	if out, errOut, code := plugin(t.Context(), "", "-n", ns, "workspace", "snapshot", "lost"); code != 0 {
		t.Fatalf("workspace snapshot: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	runTask("after", "echo gone > g")

	// The node's agent is killed and its state directory removed; it
	// comes back empty.
	agentName := "agent-" + node
	hold := localcluster.HoldPath(clusterDir, agentName)
	if err := os.MkdirAll(filepath.Dir(hold), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pid := componentPid(t, agentName)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s (pid %d): %v", agentName, pid, err)
	}
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still alive 30 s after SIGKILL", agentName, pid)
		}
	}
	if err := os.RemoveAll(filepath.Join(clusterDir, "agents", node)); err != nil {
		t.Fatal(err)
	}
	releaseAgent(t, agentName, pid)
	waitWorkspacePhase(t, ns, "lost", v1.WorkspaceSuspended, 2*time.Minute)

	first := runTask("first", "cat f; test -e g || echo no-g")
	if got := stdoutOf(first); got != "kept\nno-g\n" {
		t.Errorf("the restored copy: %q, want the snapshot's files only", got)
	}
	n := first.Status.WorkspaceRestore
	if n == nil || ptr.Deref(n.LostNode, "") != node || n.LostTime == nil || n.SnapshotTime == nil {
		t.Fatalf("the first task's status.workspaceRestore %+v, want one naming node %s", n, node)
	}
	_, errOut, code := plugin(t.Context(), "", "-n", ns, "get", "first")
	if want := "before node " + node + " was lost; changes after it are gone"; code != 0 || !strings.Contains(errOut, want) {
		t.Errorf("get first: exit %d, stderr %q; want the notice %q", code, errOut, want)
	}
	t.Logf("get first: %s", strings.TrimSpace(errOut))

	second := runTask("second", "true")
	if second.Status.WorkspaceRestore != nil {
		t.Errorf("the second task carries the notice too: %+v", second.Status.WorkspaceRestore)
	}
	if _, errOut, _ := plugin(t.Context(), "", "-n", ns, "get", "second"); strings.Contains(errOut, "restored") {
		t.Errorf("get second: stderr %q, want no notice", errOut)
	}
}

// waitWorkspacePhase waits for workspace ns/name to reach phase.
func waitWorkspacePhase(t *testing.T, ns, name string, phase v1.WorkspacePhase, timeout time.Duration) {
	t.Helper()
	var ws v1.BashWorkspace
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &ws); err != nil {
			t.Fatal(err)
		}
		if ptr.Deref(ws.Status.Phase, "") == phase {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace %s/%s: phase %s (%s) after %s, want %s", ns, name, ptr.Deref(ws.Status.Phase, ""), ptr.Deref(ws.Status.Message, ""), timeout, phase)
		}
	}
}

// stdoutOf is the tail of a task's stdout.
func stdoutOf(bt *v1.BashTask) string {
	if bt.Status.Stdout == nil {
		return ""
	}
	return ptr.Deref(bt.Status.Stdout.Tail, "")
}
