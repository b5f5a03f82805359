//go:build linux

package agent

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor/shim"
)

// A workspace's /tmp is its own (docs/workspaces.md, "/tmp"): root's,
// mode 1777, shared by its tasks and kept from one to the next, on the
// workspace's file system and so under its size limit, invisible to
// another workspace, left out of its snapshots (a restored copy has an
// empty /tmp), and made again, never followed, when a task put a
// symbolic link in its place.
func TestWorkspaceTmp(t *testing.T) {
	quota := func(c *Config) { c.Executor.DiskQuotaBytes, c.Executor.DiskQuotaCapBytes = 64<<20, 128<<20 }
	bucket := t.TempDir()
	a := newRig(t, tenantLevel(2101400, 2101409), quota, withBucket(bucket))
	wc := a.workspaceClient()
	w1 := ensure(t, wc, "tmp1", "None", false)
	ensure(t, wc, "tmp2", "None", false)
	t.Cleanup(func() {
		for _, uid := range []string{"tmp1", "tmp2"} {
			_, _ = wc.DeleteWorkspace(context.Background(), &agentv1.DeleteWorkspaceRequest{Uid: uid})
		}
	})
	run := func(r *rig, uid, ws, cmd string) *agentv1.TaskStatus {
		t.Helper()
		res := r.runTask(wsTask(uid, ws, cmd))
		if res.GetReason() != "Succeeded" {
			t.Fatalf("%s: %s %q\nstdout %q\nstderr %q", uid, res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
		}
		return res
	}
	if got := run(a, "k1", "tmp1", `stat -c '%a %u' /tmp; echo kept > /tmp/f; echo home > ~/h`).GetStdout().GetTail(); got != "1777 0\n" {
		t.Errorf("the workspace's /tmp: %q, want mode 1777 and owner 0", got)
	}
	if got := run(a, "k2", "tmp1", `cat /tmp/f`).GetStdout().GetTail(); got != "kept\n" {
		t.Errorf("/tmp in the next task: %q, want the file the last one wrote", got)
	}
	if got := run(a, "o1", "tmp2", `ls -A /tmp; echo end`).GetStdout().GetTail(); got != "end\n" {
		t.Errorf("another workspace's /tmp: %q, want it empty", got)
	}
	t.Run("quota", func(t *testing.T) {
		if !w1.GetStorageEnforced() {
			testutil.SkipUnlessStrict(t, "no loop devices or mkfs.ext4: the workspace has no file system of its own")
		}
		res := a.runTask(wsTask("q1", "tmp1", `head -c 40M /dev/zero > /tmp/a && head -c 40M /dev/zero > ~/b`))
		if res.GetReason() == "Succeeded" || !strings.Contains(res.GetStderr().GetTail(), "No space left on device") {
			t.Errorf("80 MiB in /tmp and HOME of a 64 MiB workspace: %s, stderr %q; want ENOSPC", res.GetReason(), res.GetStderr().GetTail())
		}
		run(a, "q2", "tmp1", `rm -f /tmp/a ~/b`)
	})

	// The snapshot leaves /tmp out: restored on another agent, the files
	// are back and /tmp is empty.
	snap, err := wc.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "tmp1"})
	if err != nil {
		t.Fatal(err)
	}
	b := newRig(t, tenantLevel(2101410, 2101419), withBucket(bucket))
	wb := b.workspaceClient()
	ref := &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-tmp1", Uid: "tmp1", Epoch: 2}
	if _, err := wb.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: ref, Network: "None", CarryWorkingDir: true, RestoreFrom: snap.GetSnapshot(),
	}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = wb.DeleteWorkspace(context.Background(), &agentv1.DeleteWorkspaceRequest{Uid: "tmp1"}) })
	restoredTask := wsTask("r1", "tmp1", `cat ~/h; ls -A /tmp; echo end`)
	restoredTask.Workspace.Epoch = 2
	if res := b.runTask(restoredTask); res.GetStdout().GetTail() != "home\nend\n" {
		t.Errorf("the restored copy: %s %q stdout %q, want its files and an empty /tmp", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail())
	}

	// A symbolic link where the directory was is replaced, not followed.
	run(a, "l1", "tmp1", `rm -rf ~/`+shim.WorkspaceTmpDir+` && ln -s /etc ~/`+shim.WorkspaceTmpDir)
	got := run(a, "l2", "tmp1", `ls -A /tmp; test -L ~/`+shim.WorkspaceTmpDir+` && echo link; stat -c %a /tmp`).GetStdout().GetTail()
	if got != "1777\n" {
		t.Errorf("after a task put a link to /etc in place of %s: %q, want an empty /tmp made again", shim.WorkspaceTmpDir, got)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("/etc/passwd: %v", err)
	}
}
