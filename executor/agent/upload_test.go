package agent

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gocloud.dev/blob"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// waitUploadError polls the task until its stdout's upload error contains
// want, and returns the spill then.
func waitUploadError(t *testing.T, r *rig, uid, want string) *agentv1.Spill {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: uid})
		if err != nil {
			t.Fatal(err)
		}
		sp := g.GetStatus().GetStdout().GetSpill()
		if strings.Contains(sp.GetUploadError(), want) {
			return sp
		}
		if time.Now().After(deadline) {
			t.Fatalf("no upload error containing %q within 20 s; spill %v", want, sp)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUploadCountsOnlyAfterClose (C42): a bucket whose writer fails only in
// Close (the file driver cannot write the object's attributes) leaves the
// upload pending with the error and no object; a spill file that no longer
// has the stream's byte count is never uploaded; once both are repaired,
// the retry from the node's copy stores the whole stream.
func TestUploadCountsOnlyAfterClose(t *testing.T) {
	bucketDir := filepath.Join(t.TempDir(), "bucket")
	key := "ns/task-uid-c/uid-c/stdout"
	// fileblob writes <key>.attrs in Close, after every byte was written
	// to a temporary file: a directory there makes Close, and only Close,
	// fail.
	attrsDir := filepath.Join(bucketDir, key+".attrs")
	if err := os.MkdirAll(attrsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) {
		c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true"
		c.UploadBackoffInitial = 20 * time.Millisecond
		c.UploadBackoffMax = 100 * time.Millisecond
	})
	b, err := blob.OpenBucket(t.Context(), "file://"+bucketDir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, next := r.watch()
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-c", "seq -f 'line-%04g' 1 20000")}); err != nil {
		t.Fatal(err)
	}
	fin := until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED).GetStatus()
	if sp := fin.GetStdout().GetSpill(); sp.GetUploadState() != agentv1.UploadState_UPLOAD_STATE_PENDING {
		t.Fatalf("stdout spill at finish %v, want PENDING", sp)
	}

	// The first failure is reported on the stream, for the condition.
	failed := until(t, next, agentv1.EventType_EVENT_TYPE_UPLOAD_FAILED).GetStatus().GetStdout().GetSpill()
	if !strings.Contains(failed.GetUploadError(), "closing the object writer") {
		t.Errorf("UPLOAD_FAILED event's error %q, want the failed Close", failed.GetUploadError())
	}
	sp := waitUploadError(t, r, "uid-c", "closing the object writer")
	if sp.GetUploadState() != agentv1.UploadState_UPLOAD_STATE_PENDING {
		t.Errorf("upload state after a failed Close: %v, want PENDING", sp.GetUploadState())
	}
	if ok, err := b.Exists(t.Context(), key); err != nil || ok {
		t.Errorf("object after failed Close: exists %v, %v; want none", ok, err)
	}

	// The node's copy loses bytes: uploading it would store a short
	// object under a complete-looking status. The bucket stays broken
	// until the short copy has been refused: the agent retries every
	// 20-100 ms, and an attempt that read the whole file before the
	// truncation would otherwise reach a repaired bucket and succeed.
	spill := filepath.Join(r.dir, "state", "tasks", "uid-c", "stdout")
	whole, err := os.ReadFile(spill)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(spill, 1000); err != nil {
		t.Fatal(err)
	}
	// An attempt that read the file while it shrank fails in yet
	// another way first; the refusal of the short copy is the one sought.
	const short = "holds 1000 bytes, the stream's count is 210001"
	for failed = nil; !strings.Contains(failed.GetUploadError(), short); {
		failed = until(t, next, agentv1.EventType_EVENT_TYPE_UPLOAD_FAILED).GetStatus().GetStdout().GetSpill()
	}
	// Now a bucket that works: attempts that begin after the repair
	// still refuse the short copy. Counted from a status read after it:
	// with at most one attempt in flight then, the second failure after
	// that read is an attempt that began after the repair.
	if err := os.Remove(attrsDir); err != nil {
		t.Fatal(err)
	}
	after := waitUploadError(t, r, "uid-c", short).GetUploadAttempts()
	deadline := time.Now().Add(20 * time.Second)
	for sp = waitUploadError(t, r, "uid-c", short); sp.GetUploadAttempts() < after+2; sp = waitUploadError(t, r, "uid-c", short) {
		if time.Now().After(deadline) {
			t.Fatalf("spill %v: no second attempt after the repair within 20 s", sp)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sp.GetUploadState() != agentv1.UploadState_UPLOAD_STATE_PENDING {
		t.Errorf("upload state with a short spill file: %v, want PENDING", sp.GetUploadState())
	}
	if ok, err := b.Exists(t.Context(), key); err != nil || ok {
		t.Errorf("object from a short spill file: exists %v, %v; want none", ok, err)
	}

	if err := os.WriteFile(spill, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	up := until(t, next, agentv1.EventType_EVENT_TYPE_UPLOADED).GetStatus().GetStdout()
	rd, err := b.NewReader(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	data, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{"state": up.GetSpill().GetUploadState().String(), "error": up.GetSpill().GetUploadError(), "len": len(data), "sha": sha256hex(data)}
	want := map[string]any{"state": "UPLOAD_STATE_UPLOADED", "error": "", "len": 210001, "sha": up.GetSha256()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after the repair (-want +got):\n%s", diff)
	}
}
