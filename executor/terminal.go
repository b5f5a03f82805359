package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// A task with a terminal (docs/executor.md, "A terminal"): fds 0, 1 and
// 2 of its shell are one pseudo-terminal's slave and its controlling
// terminal; the executor holds the master, reads it into the stdout
// stream (tail, spill, hash and order as any stream; stderr stays empty)
// and writes input and window sizes to it through [Task.Terminal].

// TerminalSpec asks for a terminal ([Spec.Terminal]).
type TerminalSpec struct {
	// Size is the initial window size; zero rows and columns are the
	// kernel's 0x0, which full-screen programs read as unknown.
	Size WindowSize
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Rows, Cols uint16
}

// Errors of [Task.Terminal] and of [Terminal]'s methods.
var (
	// ErrNoTerminal: the task's Spec has no Terminal.
	ErrNoTerminal = errors.New("the task has no terminal (no terminal in its spec)")
	// ErrTerminalClosed: the task ended and its terminal with it.
	ErrTerminalClosed = errors.New("the task's terminal is closed: the task ended")
)

// Terminal is the executor's end of a task's terminal, the master: input
// written to it reaches the task as typed (the line discipline echoes it
// and turns ^C, ^Z and ^\ into signals to the foreground process group),
// and a new window size reaches it as SIGWINCH. Its output is the task's
// stdout stream ([Task.Output]). Safe for concurrent use; writes are
// serialized, so each reaches the task whole.
type Terminal struct {
	master *os.File
	mu     sync.Mutex // serializes writes and their deadlines
}

// Terminal returns the task's terminal, ErrNoTerminal for a task without
// one. It stays valid after the task ended; its methods then return
// ErrTerminalClosed.
func (t *Task) Terminal() (*Terminal, error) {
	if t.term == nil {
		return nil, ErrNoTerminal
	}
	return t.term, nil
}

// Write writes p to the terminal's input, waiting while the task does not
// read (the kernel's input queue holds 4 KiB) until ctx ends. It returns
// ErrTerminalClosed once the task ended, and ctx's error when ctx ended
// before every byte was written (some may have been).
func (tm *Terminal) Write(ctx context.Context, p []byte) error {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = tm.master.SetWriteDeadline(time.Now()) })
	_, err := tm.master.Write(p)
	if !stop() {
		_ = tm.master.SetWriteDeadline(time.Time{})
		if err != nil {
			return fmt.Errorf("writing to the task's terminal: %w", ctx.Err())
		}
	}
	return tm.mapErr(err)
}

// Resize sets the terminal's window size; the kernel sends SIGWINCH to
// its foreground process group when the size changed.
func (tm *Terminal) Resize(ws WindowSize) error {
	return tm.mapErr(resizeTerminal(tm.master, ws))
}

// mapErr turns the errors of a closed master into ErrTerminalClosed.
func (tm *Terminal) mapErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrClosed) || isTerminalGone(err) {
		return ErrTerminalClosed
	}
	return fmt.Errorf("the task's terminal: %w", err)
}

// checkTerminal validates Spec.Terminal: no stdin besides it.
func checkTerminal(p *prepared) error {
	if p.Terminal != nil && p.stdinPipe() {
		return startErr(ErrInvalidSpec, "a terminal and stdin (or a stdin stream) are exclusive: the terminal is the task's standard input", nil)
	}
	return nil
}
