package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// stdinServer keeps an input by the rule of docs/stdin.md (A, the bytes
// accepted; a resend is skipped, a gap is 409) and loses answers: every
// dropEvery-th request is applied and then its connection is cut before
// the answer, every failEvery-th is refused with 503 before it is applied.
type stdinServer struct {
	mu        sync.Mutex
	got       []byte
	closed    bool
	n         int
	dropEvery int
	failEvery int
	maxAccept int // when > 0, the most bytes one request accepts (a wait for room cut short)
	requests  int
}

func (s *stdinServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	off, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	closeAfter := r.URL.Query().Get("close") == "true"
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.requests++
	if s.failEvery > 0 && s.n%s.failEvery == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	a := int64(len(s.got))
	status := func(code int, msg string) {
		w.Header().Set(HeaderStdinOffset, strconv.FormatInt(int64(len(s.got)), 10))
		w.Header().Set(HeaderStdinClosed, strconv.FormatBool(s.closed))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code), Message: msg})
	}
	if off > a {
		status(http.StatusConflict, fmt.Sprintf("offset %d is past %d", off, a))
		return
	}
	if skip := a - off; skip < int64(len(body)) {
		if s.closed {
			status(http.StatusConflict, "closed")
			return
		}
		add := body[skip:]
		if s.maxAccept > 0 && len(add) > s.maxAccept {
			add, closeAfter = add[:s.maxAccept], false
		}
		s.got = append(s.got, add...)
	}
	if closeAfter {
		s.closed = true
	}
	if s.dropEvery > 0 && s.n%s.dropEvery == 0 {
		panic(http.ErrAbortHandler) // applied, but the answer is lost
	}
	w.Header().Set(HeaderStdinOffset, strconv.Itoa(len(s.got)))
	w.Header().Set(HeaderStdinClosed, strconv.FormatBool(s.closed))
	if s.closed {
		w.Header().Set(HeaderStdinReason, StdinReasonClosed)
	}
	w.WriteHeader(http.StatusOK)
}

func newStdinClient(t *testing.T, s *stdinServer) *Client {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Across answers lost after the bytes were applied, 503s and partial
// accepts, every byte arrives once and in order, and the close arrives.
func TestStdinWriterResumesExactlyOnce(t *testing.T) {
	for _, s := range []*stdinServer{
		{dropEvery: 2},
		{dropEvery: 3, failEvery: 5},
		{maxAccept: 1000, dropEvery: 4},
	} {
		t.Run(fmt.Sprintf("drop%d-fail%d-max%d", s.dropEvery, s.failEvery, s.maxAccept), func(t *testing.T) {
			w, err := newStdinClient(t, s).Stdin(t.Context(), "ns", "task")
			if err != nil {
				t.Fatal(err)
			}
			var want []byte
			for i := range 20 {
				p := make([]byte, 1+rand.IntN(5000))
				for j := range p {
					p[j] = byte('a' + (i+j)%26)
				}
				want = append(want, p...)
				if n, err := w.Write(p); err != nil || n != len(p) {
					t.Fatalf("write %d: %d %v", i, n, err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if !bytes.Equal(s.got, want) || !s.closed {
				t.Fatalf("the server got %d bytes (closed %v), want %d: equal %v", len(s.got), s.closed, len(want), bytes.Equal(s.got, want))
			}
			if w.Offset() != int64(len(want)) {
				t.Fatalf("Offset %d, want %d", w.Offset(), len(want))
			}
		})
	}
}

// A writer made for an input that has bytes already starts at its offset,
// and new bytes after the close are a StdinClosedError.
func TestStdinWriterOffsetAndClosed(t *testing.T) {
	s := &stdinServer{got: []byte("earlier")}
	c := newStdinClient(t, s)
	w, err := c.Stdin(t.Context(), "ns", "task")
	if err != nil {
		t.Fatal(err)
	}
	if w.Offset() != 7 {
		t.Fatalf("Offset %d, want 7", w.Offset())
	}
	if _, err := w.Write([]byte(" later")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w2, err := c.Stdin(t.Context(), "ns", "task")
	if err != nil {
		t.Fatal(err)
	}
	var ce *StdinClosedError
	if _, err := w2.Write([]byte("x")); !errors.As(err, &ce) || ce.Offset != 13 {
		t.Fatalf("a write after the close: %v", err)
	}
	if string(s.got) != "earlier later" {
		t.Fatalf("got %q", s.got)
	}
}
