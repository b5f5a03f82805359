package agent

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gocloud.dev/blob"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// storedPart is one part object as the bucket holds it.
type storedPart struct {
	Offset int64
	Size   int64
	SHA256 string // the metadata's
}

// listParts returns the parts under prefix in key order, and their bytes
// concatenated.
func listParts(t *testing.T, b *blob.Bucket, prefix string) ([]storedPart, []byte) {
	t.Helper()
	var parts []storedPart
	var data []byte
	it := b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(t.Context())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		off, ok := outputkey.ParsePart(prefix, obj.Key)
		if !ok {
			continue // fileblob's .attrs side files
		}
		body, err := b.ReadAll(t.Context(), obj.Key)
		if err != nil {
			t.Fatal(err)
		}
		attrs, err := b.Attributes(t.Context(), obj.Key)
		if err != nil {
			t.Fatal(err)
		}
		if got := attrs.Metadata[MetaOffset]; got != strconv.FormatInt(off, 10) {
			t.Errorf("part %s: offset metadata %q, want %d", obj.Key, got, off)
		}
		if got, want := attrs.Metadata[MetaSHA256], sha256hex(body); got != want {
			t.Errorf("part %s: sha256 metadata %s, its bytes' %s", obj.Key, got, want)
		}
		parts = append(parts, storedPart{Offset: off, Size: int64(len(body)), SHA256: attrs.Metadata[MetaSHA256]})
		data = append(data, body...)
	}
	return parts, data
}

// partKeys lists the part keys under prefix without reading them: for a
// wait on the parts' deletion, during which a listed part may be gone
// before it could be read.
func partKeys(t *testing.T, b *blob.Bucket, prefix string) []string {
	t.Helper()
	var keys []string
	it := b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(t.Context())
		if errors.Is(err, io.EOF) {
			return keys
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := outputkey.ParsePart(prefix, obj.Key); ok {
			keys = append(keys, obj.Key)
		}
	}
}

// waitKept polls the task until its stdout's kept bytes are want.
func waitKept(t *testing.T, r *rig, uid string, want int64) *agentv1.TaskStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: uid})
		if err != nil {
			t.Fatal(err)
		}
		if g.GetStatus().GetStdout().GetKeptBytes() == want {
			return g.GetStatus()
		}
		if time.Now().After(deadline) {
			t.Fatalf("stdout kept_bytes %d after 20 s, want %d", g.GetStatus().GetStdout().GetKeptBytes(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func openBucket(t *testing.T, dir string) *blob.Bucket {
	t.Helper()
	b, err := blob.OpenBucket(t.Context(), "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestPartsBySizeAndTime: a running stream goes to the bucket in parts of
// at most PartBytes while bytes keep coming (the size trigger), and its
// rest once PartInterval passed without a full part (the time trigger);
// the parts hold exactly the spill file's bytes, in order, and the status
// reports them kept. Once the finished stream's single object is uploaded
// the parts are deleted.
func TestPartsBySizeAndTime(t *testing.T) {
	bucketDir := filepath.Join(t.TempDir(), "bucket")
	if err := os.MkdirAll(bucketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) {
		c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true"
		c.PartBytes = 64 << 10
		c.PartInterval = 2 * time.Second
	})
	b := openBucket(t, bucketDir)
	_, next := r.watch()
	// 200000 bytes at once, after the part loop has seen the task: three
	// full parts at once, the last 3392 bytes only after the interval.
	spec := taskSpec("uid-p", "sleep 0.5; head -c 200000 /dev/zero | tr '\\0' a; sleep 30")
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	prefix := "ns/task-uid-p/uid-p/stdout.parts/"
	waitKept(t, r, "uid-p", 3*64<<10)
	if parts, _ := listParts(t, b, prefix); len(parts) != 3 {
		t.Errorf("parts before the interval passed: %+v, want the three full ones", parts)
	}
	waitKept(t, r, "uid-p", 200000)
	parts, data := listParts(t, b, prefix)
	var got []storedPart
	for _, p := range parts {
		got = append(got, storedPart{Offset: p.Offset, Size: p.Size})
	}
	want := []storedPart{{0, 65536, ""}, {65536, 65536, ""}, {131072, 65536, ""}, {196608, 3392, ""}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parts (-want +got):\n%s", diff)
	}
	spill, err := os.ReadFile(filepath.Join(r.dir, "state", "tasks", "uid-p", "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	if sha256hex(data) != sha256hex(spill) {
		t.Errorf("parts hold %d bytes with SHA-256 %s, the spill file %d with %s", len(data), sha256hex(data), len(spill), sha256hex(spill))
	}

	if _, err := r.client.Cancel(t.Context(), &agentv1.CancelRequest{Uid: "uid-p"}); err != nil {
		t.Fatal(err)
	}
	up := until(t, next, agentv1.EventType_EVENT_TYPE_UPLOADED).GetStatus().GetStdout()
	obj, err := b.ReadAll(t.Context(), "ns/task-uid-p/uid-p/stdout")
	if err != nil {
		t.Fatal(err)
	}
	if sha256hex(obj) != up.GetSha256() || up.GetKeptBytes() != 200000 {
		t.Errorf("object SHA-256 %s, status %s; kept %d", sha256hex(obj), up.GetSha256(), up.GetKeptBytes())
	}
	// The parts go after the UPLOADED event.
	for deadline := time.Now().Add(20 * time.Second); ; {
		parts := partKeys(t, b, prefix)
		if len(parts) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("parts left 20 s after the object's upload: %+v", parts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPartsRetryInOrderWithoutBlocking: a bucket that refuses the first
// part gets no later part either (kept stays a contiguous prefix), the
// command's output goes on meanwhile, and once the bucket recovers the
// parts catch up in order.
func TestPartsRetryInOrderWithoutBlocking(t *testing.T) {
	bucketDir := filepath.Join(t.TempDir(), "bucket")
	if err := os.MkdirAll(bucketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	prefix := "ns/task-uid-f/uid-f/stdout.parts/"
	// fileblob writes <key>.attrs in Close: a directory there makes the
	// first part's upload, and only it, fail.
	attrsDir := filepath.Join(bucketDir, outputkey.Part(prefix, 0)+".attrs")
	if err := os.MkdirAll(attrsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) {
		c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true"
		c.PartBytes = 64 << 10
		c.PartInterval = 200 * time.Millisecond
		c.UploadBackoffInitial = 20 * time.Millisecond
		c.UploadBackoffMax = 100 * time.Millisecond
	})
	b := openBucket(t, bucketDir)
	spec := taskSpec("uid-f", "head -c 200000 /dev/zero | tr '\\0' b; sleep 1; echo more; sleep 30")
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	failures := r.srv.metrics.Uploads.WithLabelValues("part_failure")
	deadline := time.Now().Add(20 * time.Second)
	for metricValue(t, failures) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%v part failures after 20 s, want 3", metricValue(t, failures))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The command was not held up: its later line is counted.
	for {
		g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "uid-f"})
		if err != nil {
			t.Fatal(err)
		}
		if g.GetStatus().GetStdout().GetTotalBytes() == 200005 {
			if k := g.GetStatus().GetStdout().GetKeptBytes(); k != 0 {
				t.Errorf("kept %d bytes while the first part fails, want 0", k)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command's output stopped at %d bytes while the parts failed", g.GetStatus().GetStdout().GetTotalBytes())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if parts, _ := listParts(t, b, prefix); len(parts) != 0 {
		t.Errorf("parts stored past a failing first part: %+v", parts)
	}
	if err := os.Remove(attrsDir); err != nil {
		t.Fatal(err)
	}
	waitKept(t, r, "uid-f", 200005)
	parts, data := listParts(t, b, prefix)
	end := int64(0)
	for _, p := range parts {
		if p.Offset != end || p.Size > 64<<10 {
			t.Errorf("part at %d of %d bytes after %d bytes of parts: not contiguous or too large", p.Offset, p.Size, end)
		}
		end = p.Offset + p.Size
	}
	spill, err := os.ReadFile(filepath.Join(r.dir, "state", "tasks", "uid-f", "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	if sha256hex(data) != sha256hex(spill) {
		t.Errorf("parts hold %d bytes, the spill file %d, or other bytes", len(data), len(spill))
	}
}

// TestNoPartsWhereTheyBuyNothing: a stream the status tail holds whole,
// and any stream under UPLOAD_POLICY_NEVER, gets no part.
func TestNoPartsWhereTheyBuyNothing(t *testing.T) {
	bucketDir := filepath.Join(t.TempDir(), "bucket")
	if err := os.MkdirAll(bucketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) {
		c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true"
		c.PartBytes = 64 << 10
		c.PartInterval = 100 * time.Millisecond
	})
	b := openBucket(t, bucketDir)
	short := taskSpec("uid-s", "echo short; sleep 30")
	never := taskSpec("uid-n", "head -c 200000 /dev/zero | tr '\\0' c; sleep 30")
	never.Output = &agentv1.OutputSettings{Upload: agentv1.UploadPolicy_UPLOAD_POLICY_NEVER}
	for _, s := range []*agentv1.TaskSpec{short, never} {
		if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: s}); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []struct {
		uid   string
		total int64
	}{{"uid-s", 6}, {"uid-n", 200000}} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: w.uid})
			if err != nil {
				t.Fatal(err)
			}
			if g.GetStatus().GetStdout().GetTotalBytes() == w.total {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d bytes of output after 20 s, want %d", w.uid, g.GetStatus().GetStdout().GetTotalBytes(), w.total)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// A stream that gets parts, started once the other two wrote their
	// output: its last part waits an interval after its full ones, so by
	// then the loop has looked at the other two several times with every
	// byte of theirs in the spill files.
	witness := taskSpec("uid-w", "head -c 200000 /dev/zero | tr '\\0' d; sleep 30")
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: witness}); err != nil {
		t.Fatal(err)
	}
	waitKept(t, r, "uid-w", 200000)
	for _, uid := range []string{"uid-s", "uid-n"} {
		if parts, _ := listParts(t, b, "ns/task-"+uid+"/"+uid+"/stdout.parts/"); len(parts) != 0 {
			t.Errorf("%s: parts %+v, want none", uid, parts)
		}
		g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: uid})
		if err != nil {
			t.Fatal(err)
		}
		if k := g.GetStatus().GetStdout().GetKeptBytes(); k != 0 {
			t.Errorf("%s: kept %d, want 0", uid, k)
		}
	}
}

// TestOrderJournalParts: while a task writing to both streams runs, its
// order journal goes to the bucket in parts beside the streams', the run
// being read made a record once a part interval passed, so the parts keep
// the order up to then; the final object replaces them.
func TestOrderJournalParts(t *testing.T) {
	bucketDir := filepath.Join(t.TempDir(), "bucket")
	if err := os.MkdirAll(bucketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) {
		c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true"
		c.PartBytes = 64 << 10
		c.PartInterval = 200 * time.Millisecond
	})
	_, next := r.watch()
	b := openBucket(t, bucketDir)
	spec := taskSpec("uid-jp", `echo e1 >&2; sleep 0.1; head -c 100000 /dev/zero | tr '\0' x; sleep 0.1; echo e2 >&2; sleep 30`)
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	prefix := "ns/task-uid-jp/uid-jp/order.parts/"
	var recs []outputorder.Record
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, journal := listParts(t, b, prefix)
		var err error
		if recs, err = outputorder.Parse(journal); err != nil {
			t.Fatal(err)
		}
		if len(recs) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("journal parts hold %v after 20 s, want three records", recs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := []outputorder.Record{{Stream: outputorder.Stderr, Len: 3}, {Stream: outputorder.Stdout, Len: 100000}, {Stream: outputorder.Stderr, Len: 3}}
	if diff := cmp.Diff(want, recs); diff != "" {
		t.Fatalf("journal parts (-want +got):\n%s", diff)
	}
	if _, err := r.client.Cancel(t.Context(), &agentv1.CancelRequest{Uid: "uid-jp"}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	if _, err := r.client.Forget(t.Context(), &agentv1.ForgetRequest{Uid: "uid-jp"}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FORGOTTEN)
	// The parts go after the final object's UPLOADED event, which Forget
	// may follow at once: their deletion is not on the event's path.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		parts := partKeys(t, b, prefix)
		if len(parts) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("journal parts left 10 s after the final object: %+v", parts)
		}
	}
	if journal, err := b.ReadAll(t.Context(), "ns/task-uid-jp/uid-jp/order"); err != nil || len(journal) == 0 {
		t.Errorf("final order object: %d bytes, %v", len(journal), err)
	}
}
