package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Streamed standard input (Spec.StdinStream, docs/stdin.md): the pipe's
// write end belongs to a feeder that accepts bytes by input offset, holds
// at most StdinBufferBytes of them, and writes them to the pipe in order.
const (
	// StdinBufferBytes bounds the bytes a streamed input holds beyond what
	// the pipe holds (the kernel's 64 KiB): a command that does not read
	// makes writers wait once this much is buffered, so a client can never
	// grow the agent's memory past this per task. 8 MiB: two of a bulk
	// copy's 4 MiB requests, so the agent takes one whole while the
	// command still reads the one before, and the requests, which go one
	// after another, overlap with the command's reading.
	StdinBufferBytes = 8 << 20
	// DefaultStdinIdleTimeout is StdinStream.IdleTimeout when zero, as
	// BashTask spec.stdinStream.idleTimeoutSeconds defaults to 60.
	DefaultStdinIdleTimeout = 60 * time.Second
	// MaxStdinIdleTimeout is the largest StdinStream.IdleTimeout, a day
	// (the CRD's maximum of idleTimeoutSeconds).
	MaxStdinIdleTimeout = 24 * time.Hour
)

// StdinStream makes fd 0 a pipe that [Task.WriteStdin] feeds while the
// task runs. It is exclusive with Spec.Stdin.
type StdinStream struct {
	// IdleTimeout is how long the feeder waits for the next WriteStdin call
	// before it closes the pipe (the command reads EOF); the clock starts
	// with the task and stops while a call is in progress. Zero means
	// DefaultStdinIdleTimeout; at most MaxStdinIdleTimeout.
	IdleTimeout time.Duration
}

// StdinCloseReason says why a streamed input no longer accepts bytes.
type StdinCloseReason string

// The reasons of a closed streamed input.
const (
	// StdinClosed: a caller closed it (WriteStdin with close).
	StdinClosed StdinCloseReason = "Closed"
	// StdinIdleTimeout: no WriteStdin call for StdinStream.IdleTimeout.
	StdinIdleTimeout StdinCloseReason = "IdleTimeout"
	// StdinProcessExited: the command closed its end of the pipe (EPIPE on
	// a write) or the task ended while the input was open; bytes accepted
	// but not yet written to the pipe are dropped. Not an error: input is
	// offered, not forced.
	StdinProcessExited StdinCloseReason = "ProcessExited"
)

// StdinState is a streamed input's progress.
type StdinState struct {
	// AcceptedBytes is how many bytes were accepted since the start: held
	// in the buffer or written to the pipe. The next byte's offset.
	AcceptedBytes int64
	// WrittenBytes is how many of them were written to the pipe.
	WrittenBytes int64
	// Closed is true once no further byte is accepted; Reason says why.
	Closed bool
	Reason StdinCloseReason
	// TaskEnded is true once the task is over.
	TaskEnded bool
}

// Errors of [Task.WriteStdin]; each comes with the current StdinState.
var (
	// ErrStdinNotStreamed: the task's Spec has no StdinStream.
	ErrStdinNotStreamed = errors.New("the task's standard input is not streamed (no stdin stream in its spec)")
	// ErrStdinClosed: new bytes for an input that is closed (see
	// StdinState.Reason); a resend of bytes already accepted is no error.
	ErrStdinClosed = errors.New("the task's standard input is closed")
)

// StdinOffsetError is WriteStdin's error for an offset past the bytes
// accepted: a byte in between would be missing. Nothing was written.
type StdinOffsetError struct {
	// Offset is the request's offset, Accepted the bytes accepted so far.
	Offset, Accepted int64
}

// Error names the offset to send from, the bytes accepted, so that a
// client that reads only the message can still resume.
func (e *StdinOffsetError) Error() string {
	return fmt.Sprintf("stdin offset %d is past the %d bytes accepted: send from offset %d", e.Offset, e.Accepted, e.Accepted)
}

// stdinFeeder owns the write end of a streamed input's pipe. Callers
// append under mu; one goroutine (run) writes the buffer to the pipe, so
// the bytes reach the command in offset order whatever the callers do.
type stdinFeeder struct {
	w    io.WriteCloser
	idle time.Duration
	now  func() time.Time

	mu         sync.Mutex
	buf        []byte // accepted, not yet taken by run
	spare      []byte // run's last chunk, reused for buf
	inflight   int    // bytes run is writing now
	accepted   int64
	written    int64
	closing    bool // no more bytes are accepted; run closes the pipe once buf is written
	reason     StdinCloseReason
	pipeClosed bool
	ended      bool
	active     int       // WriteStdin calls in progress: the idle clock stops
	idleAt     time.Time // when the input closes for idleness, if no call comes
	timer      *time.Timer
	changed    chan struct{} // closed and replaced on every change of the above

	done chan struct{} // closed when run has returned
}

// newStdinFeeder starts feeding w; idle is the idle timeout (> 0).
func newStdinFeeder(w io.WriteCloser, idle time.Duration) *stdinFeeder {
	f := &stdinFeeder{w: w, idle: idle, now: time.Now, changed: make(chan struct{}), done: make(chan struct{})}
	f.idleAt = f.now().Add(idle)
	f.timer = time.AfterFunc(idle, f.idleCheck)
	go f.run()
	return f
}

// signalLocked wakes everyone waiting for a change.
func (f *stdinFeeder) signalLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *stdinFeeder) stateLocked() StdinState {
	return StdinState{AcceptedBytes: f.accepted, WrittenBytes: f.written, Closed: f.closing, Reason: f.reason, TaskEnded: f.ended}
}

func (f *stdinFeeder) state() StdinState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stateLocked()
}

// closeLocked stops accepting bytes for reason; the first reason stays.
func (f *stdinFeeder) closeLocked(reason StdinCloseReason) {
	if f.closing {
		return
	}
	f.closing, f.reason = true, reason
	f.timer.Stop()
	f.signalLocked()
}

// idleCheck runs when the idle timer fires. A call that started or ended
// since it was armed moved idleAt, so a stale firing re-arms instead.
func (f *stdinFeeder) idleCheck() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing || f.active > 0 {
		return
	}
	if wait := f.idleAt.Sub(f.now()); wait > 0 {
		f.timer.Reset(wait)
		return
	}
	f.closeLocked(StdinIdleTimeout)
}

// run writes the buffer to the pipe until the input is closed and every
// accepted byte is written, the command stops reading (EPIPE), or the task
// ends (shutdown closes the pipe under it).
func (f *stdinFeeder) run() {
	defer close(f.done)
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if f.pipeClosed {
			return
		}
		if len(f.buf) == 0 {
			if f.closing {
				f.closePipeLocked()
				return
			}
			ch := f.changed
			f.mu.Unlock()
			<-ch
			f.mu.Lock()
			continue
		}
		chunk := f.buf
		f.buf, f.spare = f.spare[:0], nil
		f.inflight = len(chunk)
		f.mu.Unlock()
		n, err := f.w.Write(chunk)
		f.mu.Lock()
		f.inflight = 0
		f.written += int64(n)
		f.spare = chunk
		if err != nil {
			// EPIPE: the command closed its end; ErrClosed: the task ended.
			// Neither is an error of the input: it is over, with a reason.
			f.buf = nil
			f.closeLocked(StdinProcessExited)
			f.reason = StdinProcessExited
			f.closePipeLocked()
			return
		}
		f.signalLocked() // room in the buffer
	}
}

func (f *stdinFeeder) closePipeLocked() {
	if !f.pipeClosed {
		f.pipeClosed = true
		_ = f.w.Close()
		f.signalLocked()
	}
}

// shutdown is called once the task's processes are gone: an input still
// open ends with StdinProcessExited and the pipe is closed, which also
// unblocks a write in progress.
func (f *stdinFeeder) shutdown() {
	f.mu.Lock()
	f.closeLocked(StdinProcessExited)
	f.ended = true
	f.buf = nil
	f.timer.Stop()
	f.closePipeLocked()
	f.signalLocked()
	f.mu.Unlock()
	<-f.done
}

// write implements Task.WriteStdin.
func (f *stdinFeeder) write(ctx context.Context, offset int64, data []byte, closeAfter bool) (StdinState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active++
	defer func() {
		f.active--
		if f.active == 0 && !f.closing {
			f.idleAt = f.now().Add(f.idle)
			f.timer.Reset(f.idle)
		}
	}()
	if offset < 0 {
		return f.stateLocked(), fmt.Errorf("stdin offset %d: must not be negative", offset)
	}
	if offset > f.accepted {
		return f.stateLocked(), &StdinOffsetError{Offset: offset, Accepted: f.accepted}
	}
	if skip := f.accepted - offset; skip >= int64(len(data)) {
		data = nil // a resend of bytes already accepted, or a query
	} else {
		data = data[skip:]
	}
	for len(data) > 0 {
		if f.closing {
			return f.stateLocked(), fmt.Errorf("%w (%s) after %d bytes", ErrStdinClosed, f.reason, f.accepted)
		}
		if room := StdinBufferBytes - len(f.buf) - f.inflight; room > 0 {
			n := min(room, len(data))
			f.buf = append(f.buf, data[:n]...)
			f.accepted += int64(n)
			data = data[n:]
			f.signalLocked()
			continue
		}
		// Back-pressure: the command has not read the buffer yet.
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
			f.mu.Lock()
		case <-ctx.Done():
			f.mu.Lock()
			return f.stateLocked(), ctx.Err()
		}
	}
	if closeAfter {
		f.closeLocked(StdinClosed)
	}
	return f.stateLocked(), nil
}

// WriteStdin appends data, whose first byte is at input offset offset, to
// the task's streamed standard input, exactly once: with A the bytes
// accepted so far, an offset past A is a *StdinOffsetError (nothing
// written), bytes before A are a resend and skipped, the rest appended.
// closeAfter closes the input after data (the command reads EOF once it
// has read every accepted byte). It waits while the buffer is full (the
// command does not read) until ctx ends, and then returns ctx's error with
// the bytes accepted so far in the state. ErrStdinNotStreamed without a
// StdinStream, ErrStdinClosed for new bytes after the close. Every call,
// also an empty one, restarts the idle clock.
func (t *Task) WriteStdin(ctx context.Context, offset int64, data []byte, closeAfter bool) (StdinState, error) {
	if t.stdin == nil {
		return StdinState{}, ErrStdinNotStreamed
	}
	return t.stdin.write(ctx, offset, data, closeAfter)
}

// StdinState returns the streamed input's state; false when the task's
// input is not streamed.
func (t *Task) StdinState() (StdinState, bool) {
	if t.stdin == nil {
		return StdinState{}, false
	}
	return t.stdin.state(), true
}

// checkStdinStream validates Spec.StdinStream and fills in its default.
func checkStdinStream(p *prepared) error {
	s := p.StdinStream
	if s == nil {
		return nil
	}
	switch {
	case p.Stdin != nil:
		return startErr(ErrInvalidSpec, "stdin and a stdin stream are exclusive", nil)
	case s.IdleTimeout < 0 || s.IdleTimeout > MaxStdinIdleTimeout:
		return startErr(ErrInvalidSpec, fmt.Sprintf("stdin stream idle timeout %s: must be between 0 (the default of %s) and %s", s.IdleTimeout, DefaultStdinIdleTimeout, MaxStdinIdleTimeout), nil)
	}
	c := *s
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultStdinIdleTimeout
	}
	p.StdinStream = &c
	return nil
}

// stdinPipe reports whether fd 0 is a pipe (given bytes or a stream) rather
// than /dev/null.
func (p *prepared) stdinPipe() bool { return p.Stdin != nil || p.StdinStream != nil }
