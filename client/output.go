package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// copyBufferBytes is the size of one read of a followed stream: a read
// returns as soon as some bytes arrived, so this bounds memory, not
// latency.
const copyBufferBytes = 32 << 10

// outputFollow is Run's reading of a task's output: a copy per stream to
// its writer while the task runs, completed from the status tail or
// checked against it once the task has ended.
type outputFollow struct {
	streams []*streamCopy
}

// streamCopy is one stream's copy. Its fields other than name, out and
// the channels are the copying goroutine's until done is closed.
type streamCopy struct {
	name   string // outputv1alpha1.StreamStdout or StreamStderr
	out    io.Writer
	cancel context.CancelFunc
	done   chan struct{}

	// written counts the bytes written to out, hash hashes them; err is
	// nil when the stream was read to its end.
	written int64
	hash    hash.Hash
	err     error
}

// followOutput starts the copies of the task's streams whose writers are
// set, each as the agent captures the command's bytes. It is the one
// place Run reads output: today a bashtasks/log request (follow=true) per
// stream; where the output API serves both streams in one ordered
// response, this is the function that reads that one response and splits
// it to the two writers, with the same streamCopy results.
func (c *Client) followOutput(ctx context.Context, task *bashtaskv1alpha1.BashTask, stdout, stderr io.Writer) *outputFollow {
	o := &outputFollow{}
	for _, t := range []struct {
		name string
		out  io.Writer
	}{{outputv1alpha1.StreamStdout, stdout}, {outputv1alpha1.StreamStderr, stderr}} {
		if t.out == nil {
			continue
		}
		cctx, cancel := context.WithCancel(ctx)
		s := &streamCopy{name: t.name, out: t.out, cancel: cancel, done: make(chan struct{}), hash: sha256.New()}
		o.streams = append(o.streams, s)
		go c.copyStream(cctx, task, s)
	}
	return o
}

// copyStream copies one stream from its first byte until its end, an
// error, or the copy is stopped.
func (c *Client) copyStream(ctx context.Context, task *bashtaskv1alpha1.BashTask, s *streamCopy) {
	defer close(s.done)
	r, err := c.FollowLog(ctx, task.Namespace, task.Name, LogOptions{Stream: s.name, Follow: true})
	if err != nil {
		s.err = err
		return
	}
	defer r.Close()
	if r.UID() != task.UID {
		s.err = ErrTaskReplaced
		return
	}
	buf := make([]byte, copyBufferBytes)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := s.out.Write(buf[:n]); werr != nil {
				s.err = &WriteError{Stream: s.name, Err: werr}
				return
			}
			s.hash.Write(buf[:n])
			s.written += int64(n)
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			s.err = err
			return
		}
	}
}

// stop ends the copy and waits until its goroutine returned.
func (s *streamCopy) stop() {
	s.cancel()
	<-s.done
}

// stop ends every copy.
func (o *outputFollow) stop() {
	for _, s := range o.streams {
		s.stop()
	}
}

// WriteError is a stream that could not be written to its local writer.
type WriteError struct {
	// Stream is "stdout" or "stderr"; Err the writer's error.
	Stream string
	Err    error
}

func (e *WriteError) Error() string { return fmt.Sprintf("writing %s: %v", e.Stream, e.Err) }

func (e *WriteError) Unwrap() error { return e.Err }

// finish completes the copies once the task has ended (final): a stream
// the status tail holds whole is not read further, its copy is stopped
// and the tail gives the bytes it had not written yet; the others are
// read to their end, a hole the server cannot serve filled from the tail
// when that holds the exact rest. Every stream read whole is checked
// against status totalBytes and sha256. It returns the bytes written per
// stream and an error naming each stream that is not whole.
func (o *outputFollow) finish(ctx context.Context, final *bashtaskv1alpha1.BashTask) (stdout, stderr int64, err error) {
	var errs []error
	for _, s := range o.streams {
		st := streamOf(final, s.name)
		if tailIsWhole(st) {
			s.stop()
			errs = append(errs, s.completeFromTail(final, st))
			continue
		}
		select {
		case <-s.done:
			errs = append(errs, s.complete(final, st))
		case <-ctx.Done():
			s.stop()
			errs = append(errs, fmt.Errorf("reading %s of task %s/%s from offset %d: %w", s.name, final.Namespace, final.Name, s.written, ctx.Err()))
		}
	}
	for _, s := range o.streams {
		if s.name == outputv1alpha1.StreamStderr {
			stderr = s.written
		} else {
			stdout = s.written
		}
	}
	return stdout, stderr, errors.Join(errs...)
}

// streamOf is the status of a stream; nil when the task wrote none.
func streamOf(t *bashtaskv1alpha1.BashTask, name string) *bashtaskv1alpha1.StreamStatus {
	if name == outputv1alpha1.StreamStderr {
		return t.Status.Stderr
	}
	return t.Status.Stdout
}

// tailIsWhole reports whether the status tail is the whole stream, byte
// for byte: not shortened, no byte replaced. A stream without a status is
// empty.
func tailIsWhole(st *bashtaskv1alpha1.StreamStatus) bool {
	if st == nil {
		return true
	}
	return !ptr.Deref(st.Truncated, false) && !ptr.Deref(st.Sanitized, false) &&
		int64(len(ptr.Deref(st.Tail, ""))) == ptr.Deref(st.TotalBytes, 0)
}

// completeFromTail writes what the stopped copy had not written of a
// stream whose tail is whole.
func (s *streamCopy) completeFromTail(final *bashtaskv1alpha1.BashTask, st *bashtaskv1alpha1.StreamStatus) error {
	tail := []byte(ptr.Deref(stOrEmpty(st).Tail, ""))
	if s.written > int64(len(tail)) {
		return fmt.Errorf("%s of task %s/%s: %d bytes were read, but status.%s.totalBytes is %d", s.name, final.Namespace, final.Name, s.written, s.name, len(tail))
	}
	if err := s.write(tail[s.written:]); err != nil {
		return err
	}
	return s.verify(final, st)
}

// complete checks a copy that ended on its own, filling a hole the server
// could not serve from the tail when that holds the exact rest.
func (s *streamCopy) complete(final *bashtaskv1alpha1.BashTask, st *bashtaskv1alpha1.StreamStatus) error {
	serr := asStreamError(s.err, s.written)
	var se *StreamError
	switch {
	case serr == nil:
		return s.verify(final, st)
	case !errors.As(serr, &se):
		var we *WriteError
		if errors.As(serr, &we) {
			return we
		}
		return fmt.Errorf("reading %s of task %s/%s through output.bashtask.dev: %w", s.name, final.Namespace, final.Name, serr)
	}
	tail, total := ptr.Deref(stOrEmpty(st).Tail, ""), ptr.Deref(stOrEmpty(st).TotalBytes, 0)
	start := total - int64(len(tail))
	if ptr.Deref(stOrEmpty(st).Sanitized, false) || s.written < start || s.written >= total {
		return fmt.Errorf("%s of task %s/%s: bytes %d to %d of %d cannot be read and are not in the status tail: %w",
			s.name, final.Namespace, final.Name, s.written, max(start, s.written), total, se)
	}
	if err := s.write([]byte(tail[s.written-start:])); err != nil {
		return err
	}
	return s.verify(final, st)
}

func (s *streamCopy) write(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	if _, err := s.out.Write(p); err != nil {
		return &WriteError{Stream: s.name, Err: err}
	}
	s.hash.Write(p)
	s.written += int64(len(p))
	return nil
}

// verify checks the bytes written against the status: as many as
// totalBytes, with its sha256.
func (s *streamCopy) verify(final *bashtaskv1alpha1.BashTask, st *bashtaskv1alpha1.StreamStatus) error {
	total := ptr.Deref(stOrEmpty(st).TotalBytes, 0)
	if s.written != total {
		return fmt.Errorf("%s of task %s/%s: %d bytes were read, but status.%s.totalBytes is %d", s.name, final.Namespace, final.Name, s.written, s.name, total)
	}
	want := ptr.Deref(stOrEmpty(st).SHA256, "")
	if got := hex.EncodeToString(s.hash.Sum(nil)); want != "" && got != want {
		return fmt.Errorf("%s of task %s/%s: the %d bytes read have SHA-256 %s, but status.%s.sha256 is %s", s.name, final.Namespace, final.Name, s.written, got, s.name, want)
	}
	return nil
}

func stOrEmpty(st *bashtaskv1alpha1.StreamStatus) *bashtaskv1alpha1.StreamStatus {
	if st == nil {
		return &bashtaskv1alpha1.StreamStatus{}
	}
	return st
}

// asStreamError turns a 410 Gone, the output API's answer at the start of
// a request for bytes it does not keep, into a *StreamError at offset.
func asStreamError(err error, offset int64) error {
	var se *apierrors.StatusError
	if errors.As(err, &se) && se.ErrStatus.Code == http.StatusGone {
		return &StreamError{Offset: offset, Message: se.ErrStatus.Message}
	}
	return err
}
