package plugin_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// uploadCondition reads the task's OutputUploaded condition.
func uploadCondition(t *testing.T, ns, name string) *metav1.Condition {
	t.Helper()
	return meta.FindStatusCondition(getTask(t, ns, name).Status.Conditions, bashtaskv1alpha1.ConditionOutputUploaded)
}

// waitForgotten waits until the task's agent deleted its spill files,
// which it does once the controller recorded the end and the uploads are
// done: from then on only the bucket or the status serves the output.
func waitForgotten(t *testing.T, ns, name string) {
	t.Helper()
	bt := getTask(t, ns, name)
	dir := filepath.Join(rig.Agents[ptr.Deref(bt.Status.NodeName, "")].StateDir, "tasks", string(bt.UID))
	testutil.WaitFor(t, "the agent forgot "+name, 30*time.Second, testutil.Check(func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	}, nil))
}

// TestLogsFullWhileUploadFails (C42): while the bucket refuses a finished
// task's stdout, the agent keeps its copy and logs --full reads every byte
// from it through the output API. With the agent unreachable as well no
// copy can be had but the parts uploaded while the task ran: logs --full
// writes those and exits 1 with a message naming the offset, never 0 with
// a short file; --tail-ok prints them and the tail.
// Once the bucket takes the object and the agent forgot the task, logs
// --full reads every byte from the bucket.
func TestLogsFullWhileUploadFails(t *testing.T) {
	// Not parallel: it disconnects node-1's agent, which the parallel
	// tests' tasks run on (a parallel test only starts once the
	// sequential ones are done).
	ns := newNamespace(t)
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "seq"},
		Spec: bashtaskv1alpha1.BashTaskSpec{Command: "seq 1 200000", NodeName: ptr.To("node-1"),
			Suspend: ptr.To(true)}, // held until the bucket is broken
	}
	if err := rig.Client.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	// The file bucket writes <key>.attrs in the writer's Close: a
	// directory there makes every Close of this object fail.
	attrs := filepath.Join(rig.BucketDir, ns, "seq", string(bt.UID), "stdout.attrs")
	if err := os.MkdirAll(attrs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := rig.Client.Patch(t.Context(), bt, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"suspend":false}}`))); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "OutputUploaded names the upload error", 30*time.Second, testutil.Check(func() bool {
		c := uploadCondition(t, ns, "seq")
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "closing the object writer")
	}, func() string { return fmt.Sprintf("OutputUploaded %+v", uploadCondition(t, ns, "seq")) }))
	want := seqOutput(200000) // 1288895 bytes
	st := getTask(t, ns, "seq").Status
	if ptr.Deref(st.Reason, "") != bashtaskv1alpha1.ReasonSucceeded || ptr.Deref(st.Stdout.TotalBytes, 0) != int64(len(want)) {
		t.Fatalf("task ended %s with %d bytes of stdout, want Succeeded, %d", ptr.Deref(st.Reason, ""), ptr.Deref(st.Stdout.TotalBytes, 0), len(want))
	}
	tail := ptr.Deref(st.Stdout.Tail, "")

	full := kubectlBashtask(t, ns, "logs", "seq", "--full")
	if full.code != 0 || full.stdout != want {
		t.Errorf("logs --full while the upload fails: exit %d, %d bytes, stderr %q; want 0 and all %d bytes from the agent", full.code, len(full.stdout), full.stderr, len(want))
	}

	// The parts uploaded while the task ran (a part once 1 MiB is new, in
	// the rig) are the bytes still readable: none when the task ended
	// before its first part, else the prefix the status names as kept.
	var kept int64
	if p := getTask(t, ns, "seq").Status.Stdout.Parts; p != nil {
		kept = ptr.Deref(p.KeptBytes, 0)
	}
	agent := rig.Agents["node-1"]
	agent.Disconnect()
	full = kubectlBashtask(t, ns, "logs", "seq", "--full")
	wantMsg := fmt.Sprintf("stdout: bytes %d to %d of %d cannot be read: ", kept, len(want)-len(tail), len(want))
	if full.code != plugin.ExitFailure || full.stdout != want[:kept] || !strings.Contains(full.stderr, wantMsg) || !strings.Contains(full.stderr, "--tail-ok") {
		t.Errorf("logs --full with the upload failing and the agent away: exit %d, %d bytes, stderr %q; want exit 1, the %d bytes kept as parts, and %q", full.code, len(full.stdout), full.stderr, kept, wantMsg)
	}
	tailOnly := kubectlBashtask(t, ns, "logs", "seq", "--full", "--tail-ok")
	if tailOnly.code != 0 || tailOnly.stdout != want[:kept]+tail || !strings.Contains(tailOnly.stderr, "cannot be read") {
		t.Errorf("logs --full --tail-ok: exit %d, %d bytes, stderr %q; want 0, the %d bytes kept as parts, the %d-byte tail and a note", tailOnly.code, len(tailOnly.stdout), tailOnly.stderr, kept, len(tail))
	}
	if err := agent.Reconnect(); err != nil {
		t.Fatal(err)
	}

	if err := os.Remove(attrs); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the upload recovers", 30*time.Second, testutil.Check(func() bool {
		c := uploadCondition(t, ns, "seq")
		return c != nil && c.Status == metav1.ConditionTrue
	}, func() string { return fmt.Sprintf("OutputUploaded %+v", uploadCondition(t, ns, "seq")) }))
	waitForgotten(t, ns, "seq")
	full = kubectlBashtask(t, ns, "logs", "seq", "--full")
	if sum, status := sha256hex(full.stdout), ptr.Deref(getTask(t, ns, "seq").Status.Stdout.SHA256, ""); full.code != 0 || full.stdout != want || sum != status {
		t.Errorf("logs --full from the bucket: exit %d, %d bytes, sha256 %s (status %s), stderr %q; want 0 and all %d bytes", full.code, len(full.stdout), sum, status, full.stderr, len(want))
	}
}

// TestRunWhenTheUploadFails: run reads the whole stream from the agent
// while it runs, so a bucket that refuses the upload changes nothing.
func TestRunWhenTheUploadFails(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	// A file where the file bucket needs the directory
	// <namespace>/<name>: every upload of this task fails.
	dir := filepath.Join(rig.BucketDir, ns)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "seq"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want := seqOutput(200000)
	got := kubectlBashtask(t, ns, "run", "--name", "seq", "--node", "node-2", "--", "seq 1 200000")
	if got.code != 0 || got.stdout != want {
		t.Errorf("run with a failing upload: exit %d, %d bytes (a prefix of the stream: %v), stderr %q; want 0 and all %d bytes",
			got.code, len(got.stdout), strings.HasPrefix(want, got.stdout), got.stderr, len(want))
	}
	if c := uploadCondition(t, ns, "seq"); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("OutputUploaded %+v, want False: the test's premise is a failing upload", c)
	}
}

// countingWriter counts and hashes what it is given, for streams too large
// to hold.
type countingWriter struct {
	n    int64
	hash hash.Hash
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	w.hash.Write(p)
	return len(p), nil
}

// TestRunPastTheSpillLimit: a stream longer than the agent keeps
// (spillLimitBytes, 64 MiB by default) and than its tail: run writes the
// bytes up to the limit and exits 125 naming the offset where they end,
// and how the task ended.
func TestRunPastTheSpillLimit(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const limit = bashtaskv1alpha1.DefaultSpillLimitBytes
	out := &countingWriter{hash: sha256.New()}
	got := invocation{stdout: out}.run(t, ns, "run", "--name", "huge", "--", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", limit+100000))
	xs := sha256.New()
	xs.Write(bytes.Repeat([]byte("x"), limit))
	wantMsg := fmt.Sprintf("stdout: bytes %d to %d of %d cannot be read: ", limit, limit+100000-bashtaskv1alpha1.DefaultTailBytes, limit+100000)
	if got.code != plugin.ExitPluginError || out.n != limit || !bytes.Equal(out.hash.Sum(nil), xs.Sum(nil)) ||
		!strings.Contains(got.stderr, wantMsg) || !strings.Contains(got.stderr, fmt.Sprintf("offset %d", limit)) ||
		!strings.Contains(got.stderr, "task "+ns+"/huge ended Succeeded (exit code 0)") {
		t.Errorf("run past the spill limit: exit %d, %d bytes, stderr %q; want %d, the first %d bytes, %q naming offset %d and the ending",
			got.code, out.n, got.stderr, plugin.ExitPluginError, limit, wantMsg, limit)
	}
}
