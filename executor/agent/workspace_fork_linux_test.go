//go:build linux

package agent

import (
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"

	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// forkRef is the ref of test workspace uid.
func forkRef(uid string) *agentv1.WorkspaceRef {
	return &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + uid, Uid: uid}
}

// A fork made while a task of the source writes is a prefix of those
// writes, whole (each line and file as one write made it, no torn
// state), with the source's carried directory and variables, under a
// UID of its own that owns its files; the source's writer goes on
// meanwhile, and the fork's writes stay in the fork.
func TestWorkspaceForkWhileWriting(t *testing.T) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testutil.SkipUnlessStrictf(t, "no loop devices: %v", err)
	}
	quota := func(c *Config) { c.Executor.DiskQuotaBytes, c.Executor.DiskQuotaCapBytes = 64<<20, 128<<20 }
	r := newRig(t, tenantLevel(2101500, 2101509), quota)
	wc := r.workspaceClient()
	deleteAtEnd(t, wc, "fs", "ff")
	src := ensure(t, wc, "fs", "None", true)
	if !src.GetStorageEnforced() {
		testutil.SkipUnlessStrict(t, "the node gives workspaces no file system of their own: a fork copies no image and nothing is frozen")
	}
	if res := r.runTask(wsTask("f-t1", "fs", `mkdir -p repo/seq && cd repo && export STAGE=built`)); res.GetReason() != "Succeeded" {
		t.Fatalf("f-t1: %s %s", res.GetReason(), res.GetMessage())
	}
	// The writer: file seq/N holds N, then line N goes to log.
	writer := wsTask("f-w", "fs", `cd repo; i=0; while :; do i=$((i+1)); echo $i > seq/$i; echo $i >> log; done`)
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: writer}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)

	resp, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: forkRef("ff"), Network: "None", CarryWorkingDir: true, CarryEnv: true, ForkOf: forkRef("fs"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatus()
	f := st.GetForkedFrom()
	if f.GetSource().GetUid() != "fs" || (f.GetMethod() != "SparseCopy" && f.GetMethod() != "Reflink") || f.GetFrozenMicroseconds() <= 0 ||
		st.GetRunAsUser() == src.GetRunAsUser() || st.GetWorkingDir() != executor.WorkspaceHome+"/repo" || st.GetCapacityBytes() != src.GetCapacityBytes() {
		t.Fatalf("fork status %v", st)
	}
	t.Logf("fork: %s, frozen %d µs, %d bytes copied", f.GetMethod(), f.GetFrozenMicroseconds(), f.GetCopiedBytes())

	// The fork: log is 1..N, seq/1..N hold their numbers, and at most
	// seq/N+1 besides (written before its line), holding N+1 or empty.
	check := `n=$(wc -l < log); tail -c1 log | od -An -c | tr -d ' \n'; echo; ` +
		`seq 1 $n | cmp -s - log && echo log-ok; ` +
		`for i in $(seq 1 $n); do [ "$(cat seq/$i)" = "$i" ] || echo bad $i; done; ` +
		`extra=$(( $(ls seq | wc -l) - n )); echo extra=$extra; ` +
		`[ $extra = 0 ] || { c=$(cat seq/$((n+1))); [ -z "$c" ] || [ "$c" = $((n+1)) ] || echo bad-extra "$c"; }; ` +
		`echo n=$n; pwd; echo "$STAGE"; id -u; find . ! -user $(id -u) | head -3; echo mine > fork-only`
	res := r.runTask(wsTask("f-t2", "ff", check))
	out := res.GetStdout().GetTail()
	if res.GetReason() != "Succeeded" || !strings.HasPrefix(out, "\\n\nlog-ok\n") || strings.Contains(out, "bad") ||
		!strings.Contains(out, "\n"+executor.WorkspaceHome+"/repo\nbuilt\n"+strconv.Itoa(int(st.GetRunAsUser()))+"\n") {
		t.Fatalf("the fork: %s %s\n%s\nstderr %q", res.GetReason(), res.GetMessage(), out, res.GetStderr().GetTail())
	}
	if !strings.Contains(out, "extra=0\n") && !strings.Contains(out, "extra=1\n") {
		t.Errorf("the fork holds more than one file past its log: %s", out)
	}
	n := between(out, "n=", "\n")
	if m, _ := strconv.Atoi(n); m < 2 {
		t.Errorf("the writer had written %s lines at the fork", n)
	}

	// The source went on past the fork, and has no file of the fork.
	res = r.runTask(wsTask("f-t3", "fs", `cd; test -e repo/fork-only && echo leaked; wc -l < repo/log`))
	if got, _ := strconv.Atoi(strings.TrimSpace(res.GetStdout().GetTail())); got <= mustAtoi(t, n) {
		t.Errorf("the source after the fork: %s %s %q lines (stderr %q), the fork has %s", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail(), n)
	}
	if _, err := r.client.Cancel(t.Context(), &agentv1.CancelRequest{Uid: "f-w"}); err != nil {
		t.Fatal(err)
	}
	r.finished("f-w")
}

// A fork of a workspace this agent does not hold is refused, and leaves
// nothing; a fork restored from a snapshot must name the snapshot's
// workspace as its source.
func TestWorkspaceForkRefusals(t *testing.T) {
	bucket := t.TempDir()
	r := newRig(t, tenantLevel(2101510, 2101519), withBucket(bucket))
	wc := r.workspaceClient()
	ensure(t, wc, "fa", "None", false)
	if res := r.runTask(wsTask("fa-t1", "fa", `echo a > a`)); res.GetReason() != "Succeeded" {
		t.Fatalf("fa-t1: %s %s", res.GetReason(), res.GetMessage())
	}
	_, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: forkRef("fx"), Network: "None", ForkOf: forkRef("nowhere"),
	}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "spec.fork_of") {
		t.Errorf("fork of an unknown workspace: %v, want FAILED_PRECONDITION naming spec.fork_of", err)
	}
	if _, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "fx"}); status.Code(err) != codes.NotFound {
		t.Errorf("the refused fork left a workspace: %v", err)
	}

	// A source without a file system of its own is archived into the
	// fork on the node.
	resp, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: forkRef("fb"), Network: "None", ForkOf: forkRef("fa"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.GetStatus().GetForkedFrom().GetMethod(); m != "Archive" && m != "SparseCopy" && m != "Reflink" {
		t.Errorf("method %q", m)
	}
	if res := r.runTask(wsTask("fb-t1", "fb", `cat a`)); res.GetStdout().GetTail() != "a\n" {
		t.Errorf("fb: %s %q %q", res.GetReason(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}

	// From a snapshot (a suspended source): only with the snapshot's
	// workspace as fork_of.
	snap, err := wc.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "fa"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: forkRef("fc"), Network: "None", ForkOf: forkRef("fb"), RestoreFrom: snap.GetSnapshot(),
	}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a fork of fb from fa's snapshot: %v, want INVALID_ARGUMENT", err)
	}
	resp, err = wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: forkRef("fd"), Network: "None", ForkOf: forkRef("fa"), RestoreFrom: snap.GetSnapshot(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if f := resp.GetStatus().GetForkedFrom(); f.GetMethod() != "Snapshot" || f.GetSource().GetUid() != "fa" || resp.GetStatus().GetRestoredFrom() != nil {
		t.Errorf("fork from a snapshot: %v", resp.GetStatus())
	}
	if res := r.runTask(wsTask("fd-t1", "fd", `cat a`)); res.GetStdout().GetTail() != "a\n" {
		t.Errorf("fd: %s %q %q", res.GetReason(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
}

// deleteAtEnd deletes the workspaces uids when the test ends: their file
// systems are unmounted before the test's directory goes.
func deleteAtEnd(t *testing.T, wc agentv1.WorkspacesClient, uids ...string) {
	t.Cleanup(func() {
		for _, uid := range uids {
			_, _ = wc.DeleteWorkspace(context.Background(), &agentv1.DeleteWorkspaceRequest{Uid: uid})
		}
	})
}

// between is the text of s after the first from up to the next to.
func between(s, from, to string) string {
	_, after, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(after, to)
	return v
}

// mustAtoi is strconv.Atoi that fails the test on an error.
func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
