package plugin_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
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

// TestLogsFullWhileUploadFails (C42): while the bucket refuses a finished
// task's stdout, logs --full writes nothing and exits 1 with a message
// naming the bytes and the upload error; --tail-ok prints the tail; once the
// bucket takes the object, logs --full prints every byte.
func TestLogsFullWhileUploadFails(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "seq"},
		Spec: bashtaskv1alpha1.BashTaskSpec{Command: "seq 1 200000", NodeName: ptr.To("node-1"),
			Suspend: ptr.To(true)}, // held until the bucket is broken
	}
	if err := rig.Client.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	// The agent's file bucket writes <key>.attrs in the writer's Close: a
	// directory there makes every Close of this object fail.
	attrs := filepath.Join(rig.Agents["node-1"].StateDir, "uploads", ns, "seq", string(bt.UID), "stdout.attrs")
	if err := os.MkdirAll(attrs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := rig.Client.Patch(t.Context(), bt, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"suspend":false}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "OutputUploaded names the upload error", func() bool {
		c := uploadCondition(t, ns, "seq")
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "closing the object writer")
	})
	want := seqOutput(200000) // 1288895 bytes
	st := getTask(t, ns, "seq").Status
	if ptr.Deref(st.Reason, "") != bashtaskv1alpha1.ReasonSucceeded || ptr.Deref(st.Stdout.TotalBytes, 0) != int64(len(want)) {
		t.Fatalf("task ended %s with %d bytes of stdout, want Succeeded, %d", ptr.Deref(st.Reason, ""), ptr.Deref(st.Stdout.TotalBytes, 0), len(want))
	}
	tail := ptr.Deref(st.Stdout.Tail, "")

	full := kubectlBashtask(t, ns, "logs", "seq", "--full")
	wantMsg := fmt.Sprintf("stdout: bytes 0 to %d of %d are not available (OutputUploaded is False: upload to object storage pending for stdout (attempt ",
		len(want)-len(tail), len(want))
	if full.code != plugin.ExitFailure || full.stdout != "" || !strings.Contains(full.stderr, wantMsg) ||
		!strings.Contains(full.stderr, "closing the object writer") || !strings.Contains(full.stderr, "--tail-ok") {
		t.Errorf("logs --full while the upload fails: exit %d, %d bytes, stderr %q; want exit 1, nothing, and %q with the error", full.code, len(full.stdout), full.stderr, wantMsg)
	}
	tailOnly := kubectlBashtask(t, ns, "logs", "seq", "--full", "--tail-ok")
	if tailOnly.code != 0 || tailOnly.stdout != tail || !strings.Contains(tailOnly.stderr, "are not available") {
		t.Errorf("logs --full --tail-ok: exit %d, %d bytes, stderr %q; want 0, the %d-byte tail and a note", tailOnly.code, len(tailOnly.stdout), tailOnly.stderr, len(tail))
	}

	if err := os.Remove(attrs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the upload recovers", func() bool {
		c := uploadCondition(t, ns, "seq")
		return c != nil && c.Status == metav1.ConditionTrue
	})
	full = kubectlBashtask(t, ns, "logs", "seq", "--full")
	if sum, status := sha256hex(full.stdout), ptr.Deref(getTask(t, ns, "seq").Status.Stdout.SHA256, ""); full.code != 0 || full.stdout != want || sum != status {
		t.Errorf("logs --full after the repair: exit %d, %d bytes, sha256 %s (status %s), stderr %q; want 0 and all %d bytes", full.code, len(full.stdout), sum, status, full.stderr, len(want))
	}
}

// TestRunWhenTheUploadFails (C42): run promises the whole stream; when the
// stored copy is still missing after its wait, it exits 125 with the
// missing bytes, the error and how the task ended, and what it wrote is the
// stream's beginning, never a stream with a hole.
func TestRunWhenTheUploadFails(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	// A file where the agent's file bucket needs the directory
	// <namespace>/<name>: every upload of this task fails.
	dir := filepath.Join(rig.Agents["node-2"].StateDir, "uploads", ns)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "seq"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want := seqOutput(200000)
	got := kubectlBashtask(t, ns, "run", "--name", "seq", "--node", "node-2", "--", "seq 1 200000")
	if got.code != plugin.ExitPluginError || !strings.HasPrefix(want, got.stdout) || len(got.stdout) == len(want) ||
		!strings.Contains(got.stderr, "stdout: bytes ") || !strings.Contains(got.stderr, "are not available (OutputUploaded is False: ") ||
		!strings.Contains(got.stderr, "task "+ns+"/seq ended Succeeded (exit code 0)") {
		t.Errorf("run with a failing upload: exit %d, %d bytes (a prefix of the stream: %v), stderr %q; want 125, a short prefix, the missing bytes and the ending",
			got.code, len(got.stdout), strings.HasPrefix(want, got.stdout), got.stderr)
	}
}
