package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"

	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// fetchFunc opens a stream's stored object at a byte offset.
type fetchFunc func(ctx context.Context, spill *bashtaskv1alpha1.SpillRef, offset int64) (io.ReadCloser, error)

// streamWriter writes one output stream of a task to a local writer as
// successive statuses reveal it. A status holds only the stream's last
// bytes (tail) and how many were written in all (totalBytes), so the tail
// of a snapshot covers stream offsets [totalBytes-len(tail), totalBytes);
// the writer remembers the offset it has written up to and writes what is
// new.
//
// When the stream grew by more than a tail between two snapshots, the bytes
// in between are in no status. In complete mode (run, logs --full) the
// writer then stops writing live and, when the task has ended, takes the
// rest from the stored object, so the local output is the exact stream and
// can be checked against status sha256. Otherwise (logs, logs -f) it says
// how many bytes it skipped and goes on with the tail.
type streamWriter struct {
	name     string // "stdout" or "stderr", for notes and field names
	out      io.Writer
	note     func(format string, args ...any)
	complete bool
	// tailOK (--tail-ok) lets complete mode end with the tail and a note
	// when bytes before it cannot be had; without it finish stops at the
	// first such byte with an *incompleteError, so what was written is
	// always a prefix of the stream and the exit status says it is short.
	tailOK bool

	written  int64 // stream offset up to which bytes went to out
	deferred bool  // complete mode: live writing stopped at a gap
	inexact  bool  // something other than the stream's bytes was written or skipped
	hash     hash.Hash
}

func newStreamWriter(name string, out io.Writer, note func(string, ...any), complete bool) *streamWriter {
	return &streamWriter{name: name, out: out, note: note, complete: complete, hash: sha256.New()}
}

func (w *streamWriter) write(p []byte, end int64) error {
	if _, err := w.out.Write(p); err != nil {
		return fmt.Errorf("writing %s: %w", w.name, err)
	}
	w.hash.Write(p)
	w.written = end
	return nil
}

// update writes what a status snapshot shows beyond what was written.
func (w *streamWriter) update(s *bashtaskv1alpha1.StreamStatus) error {
	if s == nil || w.deferred || ptr.Deref(s.TotalBytes, 0) <= w.written {
		return nil
	}
	tail, total, sanitized := ptr.Deref(s.Tail, ""), ptr.Deref(s.TotalBytes, 0), ptr.Deref(s.Sanitized, false)
	start := total - int64(len(tail))
	// A sanitized tail has U+FFFD where the stream had other bytes, so its
	// offsets do not match the stream's; complete mode waits for the raw
	// bytes in storage instead.
	if w.complete && (start > w.written || sanitized) {
		w.deferred = true
		if start > w.written {
			w.note("%s: %d bytes went past the status tail before they could be shown; the rest of %s is written when the task ends, from storage",
				w.name, start-w.written, w.name)
		} else {
			w.note("%s is not valid UTF-8; it is written when the task ends, from storage", w.name)
		}
		return nil
	}
	if start > w.written {
		w.note("%s: %d bytes not shown (they went past the tail kept in status)", w.name, start-w.written)
		w.inexact = true
		w.written = start
	}
	if sanitized {
		w.inexact = true
	}
	return w.write([]byte(tail[w.written-start:]), total)
}

// finish writes the rest of the stream of a task that has ended: from the
// stored object where the tail does not cover it (complete mode), else from
// the tail. missing says why there is no object, for the note when bytes
// cannot be shown.
func (w *streamWriter) finish(ctx context.Context, s *bashtaskv1alpha1.StreamStatus, fetch fetchFunc, missing string) error {
	if s == nil {
		return nil
	}
	tail, total := ptr.Deref(s.Tail, ""), ptr.Deref(s.TotalBytes, 0)
	start := total - int64(len(tail))
	stored := s.Spill != nil && ptr.Deref(s.Spill.URL, "") != ""
	if w.complete && w.needsObject(s) && stored && w.written < ptr.Deref(s.Spill.Bytes, 0) {
		if err := w.copyObject(ctx, s.Spill, fetch); err != nil {
			return err
		}
	}
	if w.written < total {
		if start > w.written && !w.complete {
			w.note("%s: %d bytes not shown (they went past the tail kept in status)", w.name, start-w.written)
			w.inexact = true
			w.written = start
		}
		if start > w.written {
			why := missing
			if stored && !ptr.Deref(s.Spill.Complete, false) {
				why = "the stored object ends where the stream passed spec.output.spillLimitBytes"
			}
			if w.complete && !w.tailOK {
				return &incompleteError{stream: w.name, from: w.written, to: start, total: total, why: why, tail: len(tail)}
			}
			w.note("%s: bytes %d to %d of %d are not available (%s); the last %d bytes follow",
				w.name, w.written, start, total, why, len(tail))
			w.inexact = true
			w.written = start
		}
		if ptr.Deref(s.Sanitized, false) {
			if w.complete && !w.tailOK {
				return &incompleteError{stream: w.name, from: w.written, to: total, total: total, tail: len(tail), sanitized: true,
					why: "its tail in status has invalid UTF-8 replaced by U+FFFD and " + missing}
			}
			w.note("%s: the tail in status has invalid UTF-8 replaced by U+FFFD", w.name)
			w.inexact = true
		}
		if err := w.write([]byte(tail[w.written-start:]), total); err != nil {
			return err
		}
	}
	return w.verify(s)
}

// needsObject reports whether the tail cannot supply the exact rest.
func (w *streamWriter) needsObject(s *bashtaskv1alpha1.StreamStatus) bool {
	total := ptr.Deref(s.TotalBytes, 0)
	start := total - int64(len(ptr.Deref(s.Tail, "")))
	return w.written < total && (w.deferred || start > w.written || ptr.Deref(s.Sanitized, false))
}

func (w *streamWriter) copyObject(ctx context.Context, spill *bashtaskv1alpha1.SpillRef, fetch fetchFunc) error {
	url := ptr.Deref(spill.URL, "")
	r, err := fetch(ctx, spill, w.written)
	if err != nil {
		return fmt.Errorf("reading the stored %s at %s: %w", w.name, url, err)
	}
	defer func() { _ = r.Close() }()
	from := w.written
	n, err := io.Copy(io.MultiWriter(w.out, w.hash), r)
	w.written += n
	if err != nil {
		return fmt.Errorf("reading the stored %s at %s (after %d bytes): %w", w.name, url, from+n, err)
	}
	if bytes := ptr.Deref(spill.Bytes, 0); w.written != bytes {
		return fmt.Errorf("the stored %s at %s ends after %d bytes; status.%s.spill.bytes says %d", w.name, url, w.written, w.name, bytes)
	}
	w.deferred = false
	return nil
}

// verify checks the bytes written against the stream's SHA-256 when they
// are meant to be the exact stream.
func (w *streamWriter) verify(s *bashtaskv1alpha1.StreamStatus) error {
	want := ptr.Deref(s.SHA256, "")
	if !w.complete || w.inexact || want == "" || w.written != ptr.Deref(s.TotalBytes, 0) {
		return nil
	}
	if got := hex.EncodeToString(w.hash.Sum(nil)); got != want {
		return fmt.Errorf("%s: the %d bytes written have SHA-256 %s, but status.%s.sha256 is %s", w.name, w.written, got, w.name, want)
	}
	return nil
}

// incompleteError says that complete mode stopped at bytes it cannot
// deliver: the stored copy is missing, pending or cut at the spill limit.
type incompleteError struct {
	stream          string
	from, to, total int64
	tail            int
	sanitized       bool
	why             string
}

func (e *incompleteError) Error() string {
	written := fmt.Sprintf("the first %d bytes", e.from)
	if e.from == 0 {
		written = "none of it"
	}
	if e.sanitized {
		return fmt.Sprintf("%s: the exact bytes %d to %d of %d cannot be written: %s; "+
			"wrote %s (add --tail-ok to accept the last %d bytes with U+FFFD in place of invalid UTF-8)",
			e.stream, e.from, e.to, e.total, e.why, written, e.tail)
	}
	return fmt.Sprintf("%s: bytes %d to %d of %d are not available (%s); "+
		"wrote %s rather than a stream with a hole (add --tail-ok to accept the last %d bytes after a note)",
		e.stream, e.from, e.to, e.total, e.why, written, e.tail)
}
