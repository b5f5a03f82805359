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

// outputFollow is Run's reading of a task's output: with both writers
// set, one follow of the combined stream (stream=all) split to the two
// writers in the order the agent read the bytes; with one, a follow of
// that stream. Once the task has ended, each stream is completed from
// its status tail or checked against it.
type outputFollow struct {
	streams []*streamCopy
	// combined: the streams are read together, from one stream=all
	// follow that both streamCopies' done and err describe.
	combined bool
	// client reads the single streams when the combined one cannot be
	// read whole.
	client *Client
	// cancel stops every copy; each streamCopy holds it too.
	cancel context.CancelFunc
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

// Write writes p to the stream's writer, counting and hashing it; a
// failure is a *WriteError naming the stream.
func (s *streamCopy) Write(p []byte) (int, error) {
	n, err := s.out.Write(p)
	s.hash.Write(p[:n])
	s.written += int64(n)
	if err != nil {
		return n, &WriteError{Stream: s.name, Err: err}
	}
	return n, nil
}

// followOutput starts reading the task's output to the writers that are
// set, as the agent captures the command's bytes: one bashtasks/log
// request (follow=true) of stream=all split to both, or one of the
// stream for one. It is the one place Run reads output.
func (c *Client) followOutput(ctx context.Context, task *bashtaskv1alpha1.BashTask, stdout, stderr io.Writer) *outputFollow {
	cctx, cancel := context.WithCancel(ctx)
	o := &outputFollow{combined: stdout != nil && stderr != nil, client: c, cancel: cancel}
	for _, t := range []struct {
		name string
		out  io.Writer
	}{{outputv1alpha1.StreamStdout, stdout}, {outputv1alpha1.StreamStderr, stderr}} {
		if t.out == nil {
			continue
		}
		s := &streamCopy{name: t.name, out: t.out, cancel: cancel, done: make(chan struct{}), hash: sha256.New()}
		o.streams = append(o.streams, s)
		if !o.combined {
			go c.copyStream(cctx, task, s, 0)
		}
	}
	if o.combined {
		go c.copyCombined(cctx, task, o.streams[0], o.streams[1])
	}
	return o
}

// copyCombined follows stream=all and splits it to out and errOut, which
// share its cancel function: both end together, with the follow's error.
func (c *Client) copyCombined(ctx context.Context, task *bashtaskv1alpha1.BashTask, out, errOut *streamCopy) {
	err := c.readCombined(ctx, task, out, errOut)
	out.err, errOut.err = err, err
	close(out.done)
	close(errOut.done)
}

// readCombined writes stream=all from its start to out and errOut until
// its end.
func (c *Client) readCombined(ctx context.Context, task *bashtaskv1alpha1.BashTask, out, errOut *streamCopy) error {
	r, err := c.FollowLog(ctx, task.Namespace, task.Name, LogOptions{Stream: outputv1alpha1.StreamAll, Follow: true})
	if err != nil {
		return err
	}
	defer r.Close()
	if r.UID() != task.UID {
		return ErrTaskReplaced
	}
	_, err = Demux(r, out, errOut)
	return err
}

// copyStream copies one stream from offset until its end, an error, or
// the copy is stopped.
func (c *Client) copyStream(ctx context.Context, task *bashtaskv1alpha1.BashTask, s *streamCopy, offset int64) {
	defer close(s.done)
	s.err = c.readStream(ctx, task, s, offset)
}

// readStream writes one stream from offset to s until its end.
func (c *Client) readStream(ctx context.Context, task *bashtaskv1alpha1.BashTask, s *streamCopy, offset int64) error {
	r, err := c.FollowLog(ctx, task.Namespace, task.Name, LogOptions{Stream: s.name, Offset: offset, Follow: true})
	if err != nil {
		return err
	}
	defer r.Close()
	if r.UID() != task.UID {
		return ErrTaskReplaced
	}
	_, err = io.CopyBuffer(s, r, make([]byte, copyBufferBytes))
	return err
}

// stop ends the copy and waits until its goroutine returned.
func (s *streamCopy) stop() {
	s.cancel()
	<-s.done
}

// stop ends every copy.
func (o *outputFollow) stop() {
	o.cancel()
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
	if o.combined {
		errs = o.finishCombined(ctx, final)
	}
	for _, s := range o.streams {
		if o.combined {
			break
		}
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

// finishCombined is finish for the combined follow. The order matters
// only where both streams have bytes: when one is empty and the other's
// tail holds it whole, the follow is stopped and the tail written;
// otherwise the follow is read to its end, and a combined stream that
// cannot be read whole is completed stream by stream from the offsets
// reached (the single streams, then their tails, as finish does).
func (o *outputFollow) finishCombined(ctx context.Context, final *bashtaskv1alpha1.BashTask) []error {
	out, errOut := o.streams[0], o.streams[1]
	so, se := streamOf(final, out.name), streamOf(final, errOut.name)
	if tailIsWhole(so) && tailIsWhole(se) && (ptr.Deref(stOrEmpty(so).TotalBytes, 0) == 0 || ptr.Deref(stOrEmpty(se).TotalBytes, 0) == 0) {
		out.stop()
		return []error{out.completeFromTail(final, so), errOut.completeFromTail(final, se)}
	}
	select {
	case <-out.done:
	case <-ctx.Done():
		out.stop()
		return []error{fmt.Errorf("reading the output of task %s/%s (stdout to offset %d, stderr to %d): %w",
			final.Namespace, final.Name, out.written, errOut.written, ctx.Err())}
	}
	var we *WriteError
	switch {
	case out.err == nil:
		return []error{out.verify(final, so), errOut.verify(final, se)}
	case errors.As(out.err, &we):
		return []error{we}
	}
	var errs []error
	for _, s := range o.streams {
		s.err = o.client.readStream(ctx, final, s, s.written)
		errs = append(errs, s.complete(final, streamOf(final, s.name)))
	}
	return errs
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
