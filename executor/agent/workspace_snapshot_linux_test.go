//go:build linux

package agent

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// withBucket gives the agent the file bucket in dir.
func withBucket(dir string) rigOption {
	return func(c *Config) { c.BucketURL = "file://" + dir + "?no_tmp_dir=true" }
}

// A workspace snapshot taken on one agent restores on another, with its
// files, its carried directory and variables, under the UID the second
// agent leases; the first agent's copy, of the older epoch, refuses the
// tasks of the new one; and a snapshot to a failing bucket fails without
// a trace of an object.
func TestWorkspaceSnapshotRestoreElsewhere(t *testing.T) {
	bucket := t.TempDir()
	a := newRig(t, tenantLevel(2101300, 2101309), withBucket(bucket))
	b := newRig(t, tenantLevel(2101310, 2101319), withBucket(bucket))
	wa, wb := a.workspaceClient(), b.workspaceClient()
	ref := func(epoch int64) *agentv1.WorkspaceRef {
		return &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-s1", Uid: "s1", Epoch: epoch}
	}
	if _, err := wa.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: ref(1), Network: "None", CarryWorkingDir: true, CarryEnv: true,
	}}); err != nil {
		t.Fatal(err)
	}
	task := func(uid, cmd string, epoch int64) *agentv1.TaskSpec {
		s := wsTask(uid, "s1", cmd)
		s.Workspace.Epoch = epoch
		return s
	}
	res := a.runTask(task("t1", `mkdir -p repo/empty && cd repo && printf 'one\n' > f && chmod 640 f && ln -s f link && ln f hard && export STAGE=built`, 1))
	if res.GetReason() != "Succeeded" {
		t.Fatalf("t1: %s %s %q", res.GetReason(), res.GetMessage(), res.GetStderr().GetTail())
	}
	snap, err := wa.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	s := snap.GetSnapshot()
	if s.GetBytes() == 0 || len(s.GetSha256()) != 64 || s.GetEpoch() != 1 || s.GetLastTaskUid() != "t1" || s.GetFiles() != 1 ||
		!strings.HasPrefix(s.GetKey(), "workspaces/ns/ws-s1/s1/1-") {
		t.Fatalf("snapshot %v", s)
	}
	if fi, err := os.Stat(filepath.Join(bucket, s.GetKey())); err != nil || fi.Size() != s.GetBytes() {
		t.Fatalf("the object: %v %v", fi, err)
	}

	// Restored on b at epoch 2.
	resp, err := wb.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: ref(2), Network: "None", CarryWorkingDir: true, CarryEnv: true, RestoreFrom: s,
	}})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatus()
	if st.GetEpoch() != 2 || st.GetRestoredFrom().GetKey() != s.GetKey() || st.GetWorkingDir() != executor.WorkspaceHome+"/repo" ||
		!slices.Contains(st.GetCarryEnvNames(), "STAGE") || st.GetLastTaskUid() != "t1" {
		t.Errorf("restored status %v", st)
	}
	res = b.runTask(task("t2", `pwd; echo "$STAGE"; id -u; stat -c '%a %U %h' f; readlink link; ls -d empty; cat f`, 2))
	want := executor.WorkspaceHome + "/repo\nbuilt\n" + itoa(int(st.GetRunAsUser())) + "\n640 task 2\nf\nempty\none\n"
	if res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != want {
		t.Errorf("t2 on the restored copy: %s %s\nstdout %q\nwant   %q\nstderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), want, res.GetStderr().GetTail())
	}

	// The stale copy on a refuses a task of epoch 2, and an Ensure of it.
	res = a.runTask(task("t3", `echo ran`, 2))
	if res.GetReason() != "StartFailed" || !strings.Contains(res.GetMessage(), "copy is of epoch 1") || res.GetStdout().GetTail() != "" {
		t.Errorf("a task of epoch 2 on the stale copy: %s %q %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail())
	}
	if _, err := wa.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: ref(2), Network: "None", CarryWorkingDir: true, CarryEnv: true,
	}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Ensure of epoch 2 on the stale copy: %v, want FAILED_PRECONDITION", err)
	}

	// Another workspace's snapshot is refused, whatever the request
	// says, and nothing is made (docs/security.md: snapshots bound to
	// their workspace).
	s2 := &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-s2", Uid: "s2", Epoch: 1}
	if _, err := wb.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: s2, Network: "None", RestoreFrom: s,
	}}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is not one of workspace ns/ws-s2") {
		t.Errorf("restore of ws-s2 from ws-s1's snapshot: %v, want INVALID_ARGUMENT naming the workspace", err)
	}
	if _, err := wb.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "s2"}); status.Code(err) != codes.NotFound {
		t.Errorf("the refused restore left a workspace: %v", err)
	}

	// A restore that does not match its status's digest is refused: the
	// same object under ws-s2's own prefix, with another digest.
	bad := proto.CloneOf(s)
	bad.Key = agentv1.SnapshotKeyPrefix(s2) + path.Base(s.GetKey())
	bad.Url = strings.TrimSuffix(s.GetUrl(), s.GetKey()) + bad.Key
	bad.Sha256 = strings.Repeat("0", 64)
	copyFile(t, filepath.Join(bucket, s.GetKey()), filepath.Join(bucket, bad.Key))
	if _, err := wb.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: s2, Network: "None", RestoreFrom: bad,
	}}); status.Code(err) != codes.DataLoss {
		t.Errorf("restore with a wrong digest: %v, want DATA_LOSS", err)
	}
	if _, err := wb.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "s2"}); status.Code(err) != codes.NotFound {
		t.Errorf("the failed restore left a workspace: %v", err)
	}

	// The bucket fails: no object, an UNAVAILABLE error, and the
	// workspace goes on.
	if err := os.RemoveAll(bucket); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bucket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := wb.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "s1"}); status.Code(err) != codes.Unavailable {
		t.Errorf("snapshot to a failing bucket: %v, want UNAVAILABLE", err)
	}
	if res := b.runTask(task("t4", `cat f`, 2)); res.GetStdout().GetTail() != "one\n" {
		t.Errorf("after the failed snapshot: %s %q", res.GetReason(), res.GetStdout().GetTail())
	}
}

// copyFile copies the file from to to, making to's directory.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
