package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// logServer serves one stream by the contract of docs/output.md, cutting
// the first cuts connections after cutAfter bytes of their body (a
// connection lost mid-stream), ending with the trailer error from
// keptBytes on, and answering uid for the task.
type logServer struct {
	data      []byte
	keptBytes int // bytes past this are not kept: trailer mid-response, 410 at the start
	cutAfter  int
	mu        sync.Mutex
	cuts      int
	uid       string
	requests  []int64 // the offsets asked for
}

func (s *logServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	off, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	s.mu.Lock()
	s.requests = append(s.requests, off)
	cut := s.cuts > 0
	if cut {
		s.cuts--
	}
	uid := s.uid
	s.mu.Unlock()
	if int(off) >= s.keptBytes && s.keptBytes < len(s.data) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGone)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: http.StatusGone, Reason: metav1.StatusReasonGone, Message: fmt.Sprintf("stdout from offset %d is not kept", off)})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set(HeaderOffset, strconv.FormatInt(off, 10))
	h.Set(HeaderTotal, strconv.Itoa(len(s.data)))
	h.Set(HeaderComplete, "true")
	h.Set(HeaderTaskUID, uid)
	h.Set("Trailer", TrailerEndOffset+", "+TrailerError)
	w.WriteHeader(http.StatusOK)
	end := min(len(s.data), s.keptBytes)
	body := s.data[off:end]
	if cut {
		_, _ = w.Write(body[:min(len(body), s.cutAfter)])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection is closed mid-body
	}
	_, _ = w.Write(body)
	if end < len(s.data) {
		h.Set(TrailerEndOffset, strconv.Itoa(end))
		h.Set(TrailerError, fmt.Sprintf("stdout from offset %d is not kept", end))
	}
}

func newTestClient(t *testing.T, s *logServer) *Client {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testData() []byte {
	var b bytes.Buffer
	for i := range 20000 {
		fmt.Fprintf(&b, "línea %d ✓\n", i)
	}
	return b.Bytes()
}

func TestFollowLogResumesAfterCuts(t *testing.T) {
	data := testData()
	s := &logServer{data: data, keptBytes: len(data), cutAfter: 50001, cuts: 3, uid: "u1"}
	c := newTestClient(t, s)
	r, err := c.FollowLog(t.Context(), "ns", "t", LogOptions{Offset: 2, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[2:]) {
		t.Fatalf("read %d bytes, want the %d from offset 2", len(got), len(data)-2)
	}
	want := []int64{2, 50003, 100004, 150005}
	if fmt.Sprint(s.requests) != fmt.Sprint(want) {
		t.Errorf("offsets asked %v, want %v", s.requests, want)
	}
}

func TestFollowLogTrailerError(t *testing.T) {
	data := testData()
	s := &logServer{data: data, keptBytes: 70000, uid: "u1"}
	c := newTestClient(t, s)
	r, err := c.FollowLog(t.Context(), "ns", "t", LogOptions{Offset: 10})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	var se *StreamError
	if !errors.As(err, &se) || se.Offset != 70000 || !bytes.Equal(got, data[10:70000]) {
		t.Fatalf("read %d bytes, %v; want 69990 then a StreamError at 70000", len(got), err)
	}
	// At the start: the Status error.
	if _, err := c.FollowLog(t.Context(), "ns", "t", LogOptions{Offset: 80000}); !apierrors.IsGone(err) {
		t.Errorf("from 80000: %v, want 410", err)
	}
}

func TestFollowLogTaskReplaced(t *testing.T) {
	data := testData()
	s := &logServer{data: data, keptBytes: len(data), cutAfter: 1000, cuts: 1, uid: "u1"}
	c := newTestClient(t, s)
	r, err := c.FollowLog(context.Background(), "ns", "t", LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 1000)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.uid = "u2"
	s.mu.Unlock()
	if _, err := io.ReadAll(r); !errors.Is(err, ErrTaskReplaced) {
		t.Errorf("after the UID changed: %v, want ErrTaskReplaced", err)
	}
}
