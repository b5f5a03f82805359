package outputapi

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// storedServer is a Server that reads a file bucket, as with
// --output-bucket-url.
func storedServer(t *testing.T) *Server {
	t.Helper()
	dir := t.TempDir()
	b, err := blob.OpenBucket(t.Context(), "file://"+dir+"?no_tmp_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &Server{bucket: b, bucketBase: "file://" + dir}
}

func put(t *testing.T, s *Server, key string, data []byte) {
	t.Helper()
	if err := s.bucket.WriteAll(t.Context(), key, data, nil); err != nil {
		t.Fatal(err)
	}
}

// framed renders records over the streams' bytes.
func framed(recs []outputorder.Record, streams [3][]byte) []byte {
	var out []byte
	var c outputorder.Cursor
	for _, r := range recs {
		_ = c.Walk(r, 0, func(p outputorder.Piece) error {
			if len(p.Header) > 0 {
				out = append(out, p.Header...)
			} else {
				out = append(out, streams[p.Stream][p.Offset:p.Offset+p.Len]...)
			}
			return nil
		})
	}
	return out
}

func journalOf(recs ...outputorder.Record) []byte {
	var j []byte
	for i, r := range recs {
		j = outputorder.AppendRecord(j, r, i == 0)
	}
	return j
}

// serveStored runs combinedFromStorage from offset with limit and returns
// the body, the response's headers and the error it ended with.
func serveStored(s *Server, task *bashtaskv1alpha1.BashTask, offset, limit int64) ([]byte, http.Header, error) {
	rec := httptest.NewRecorder()
	lr := &logResponse{w: rec, rc: http.NewResponseController(rec), offset: offset, limit: limit}
	err := s.combinedFromStorage(context.Background(), lr, task, nil)
	return rec.Body.Bytes(), rec.Header(), err
}

func storedTask() *bashtaskv1alpha1.BashTask {
	return &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t", UID: "u1"}}
}

// TestCombinedFromStorage: stream=all of a task its agent forgot, framed
// from the order journal and the stream's uploaded copy in the bucket and
// the other stream's status tail; every offset, inside a header or a
// payload, resumes with the same bytes, and limitBytes cuts them.
func TestCombinedFromStorage(t *testing.T) {
	s := storedServer(t)
	out := bytes.Repeat([]byte("o"), outputorder.MaxFramePayload+100) // two frames in one run
	errs := []byte("e1\ne2\n")
	recs := []outputorder.Record{{Stream: outputorder.Stderr, Len: 3}, {Stream: outputorder.Stdout, Len: 50}, {Stream: outputorder.Stderr, Len: 3}}
	put(t, s, "ns/t/u1/order", journalOf(recs...))
	put(t, s, "ns/t/u1/stdout", out)
	task := storedTask()
	task.Status.Stdout = &bashtaskv1alpha1.StreamStatus{TotalBytes: ptr.To(int64(len(out))), Truncated: ptr.To(true), Tail: ptr.To("ooo"),
		Spill: &bashtaskv1alpha1.SpillRef{URL: ptr.To(s.bucketBase + "/ns/t/u1/stdout"), Bytes: ptr.To(int64(len(out)))}}
	task.Status.Stderr = &bashtaskv1alpha1.StreamStatus{TotalBytes: ptr.To(int64(len(errs))), Tail: ptr.To(string(errs))}
	// The last run, stdout's rest, has no record.
	want := framed(append(recs, outputorder.Record{Stream: outputorder.Stdout, Len: int64(len(out)) - 50}), [3][]byte{nil, out, errs})

	body, h, err := serveStored(s, task, 0, 0)
	if err != nil || !bytes.Equal(body, want) {
		t.Fatalf("from 0: %d bytes, %v; want %d", len(body), err, len(want))
	}
	if h.Get("Bashtask-Stream-Total") != strconv.Itoa(len(want)) || h.Get("Bashtask-Stream-Complete") != "true" {
		t.Errorf("headers %v", h)
	}
	for _, off := range []int64{3, 8, 12, 30, int64(len(want)) - outputorder.MaxFramePayload, int64(len(want)) - 5, int64(len(want))} {
		if body, _, err := serveStored(s, task, off, 0); err != nil || !bytes.Equal(body, want[off:]) {
			t.Errorf("from %d: %d bytes, %v; want %d", off, len(body), err, len(want)-int(off))
		}
	}
	if body, _, err := serveStored(s, task, 5, 20); err != nil || !bytes.Equal(body, want[5:25]) {
		t.Errorf("from 5, limit 20: %q, %v; want %q", body, err, want[5:25])
	}
	if _, _, err := serveStored(s, task, int64(len(want))+1, 0); !isStatus(err, http.StatusRequestedRangeNotSatisfiable) {
		t.Errorf("past the end: %v, want 416", err)
	}
	// Without the journal the order is not kept: 410.
	if err := s.bucket.Delete(t.Context(), "ns/t/u1/order"); err != nil {
		t.Fatal(err)
	}
	task.Status.NodeName = nil
	if _, _, err := serveStored(s, task, 0, 0); !isStatus(err, http.StatusGone) {
		t.Errorf("without a journal: %v, want 410", err)
	}
}

// TestCombinedFromParts: a task whose agent was lost is framed from its
// journal's parts and its streams' parts up to the last record, and the
// bytes after are reported lost at their framed offset.
func TestCombinedFromParts(t *testing.T) {
	s := storedServer(t)
	out := []byte("0123456789abcdefghij")
	recs := []outputorder.Record{{Stream: outputorder.Stderr, Len: 3}, {Stream: outputorder.Stdout, Len: 20}, {Stream: outputorder.Stderr, Len: 3}}
	j := journalOf(recs...)
	put(t, s, outputkey.Part("ns/t/u1/order.parts/", 0), j[:2])
	put(t, s, outputkey.Part("ns/t/u1/order.parts/", 2), j[2:])
	put(t, s, outputkey.Part("ns/t/u1/stdout.parts/", 0), out[:12])
	put(t, s, outputkey.Part("ns/t/u1/stdout.parts/", 12), out[12:])
	task := storedTask()
	task.Status.Reason = ptr.To(bashtaskv1alpha1.ReasonAgentLost)
	task.Status.Stdout = &bashtaskv1alpha1.StreamStatus{TotalBytes: ptr.To(int64(25)), Truncated: ptr.To(true), Tail: ptr.To("x"),
		Parts: &bashtaskv1alpha1.StreamParts{KeptBytes: ptr.To(int64(20)), LostFromOffset: ptr.To(int64(20))}}
	task.Status.Stderr = &bashtaskv1alpha1.StreamStatus{TotalBytes: ptr.To(int64(6)), Tail: ptr.To("e1\ne2\n")}
	want := framed(recs, [3][]byte{nil, out, []byte("e1\ne2\n")})

	body, _, err := serveStored(s, task, 0, 0)
	if !bytes.Equal(body, want) || err == nil || !strings.Contains(err.Error(), "offset "+strconv.Itoa(len(want))+" on are lost") {
		t.Fatalf("from 0: %q, %v; want %q, then the bytes from %d lost", body, err, want, len(want))
	}
	if body, _, err := serveStored(s, task, 13, 0); !bytes.Equal(body, want[13:]) || err == nil {
		t.Errorf("from 13 (inside stdout's frame, across its parts): %q, %v", body, err)
	}
	if _, _, err := serveStored(s, task, int64(len(want)), 0); !isStatus(err, http.StatusGone) {
		t.Errorf("at the end of what is kept: %v, want 410", err)
	}
	// Stdout kept only up to 12: the frame ends there, with the error.
	task.Status.Stdout.Parts.KeptBytes = ptr.To(int64(12))
	if err := s.bucket.Delete(t.Context(), outputkey.Part("ns/t/u1/stdout.parts/", 12)); err != nil {
		t.Fatal(err)
	}
	body, _, err = serveStored(s, task, 0, 0)
	if !bytes.Equal(body, want[:8+3+8+12]) || err == nil || !strings.Contains(err.Error(), "offset 31") {
		t.Errorf("stdout kept up to 12: %q, %v; want %q and an error at offset 31", body, err, want[:31])
	}
}

func isStatus(err error, code int32) bool {
	se, ok := err.(interface{ Status() metav1.Status })
	return ok && se.Status().Code == code
}
