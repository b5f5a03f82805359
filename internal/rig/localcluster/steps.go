package localcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Step is one named part of a local cluster's start-up, with the undo
// that takes it back. The launcher runs its steps in order and, when one
// fails or the cluster stops, undoes those that ran in reverse order: what
// started last depends on what started first (the agents on the control
// plane, the controller on the agents), so it must go first. One list
// instead of a start function and a separate stop function keeps the two
// from drifting apart when a step is added.
type Step struct {
	// Name identifies the step in logs and errors, such as
	// "control-plane" or "agent node-2".
	Name string
	// Do performs the step.
	Do func(ctx context.Context) error
	// Undo takes the step back; nil when there is nothing to take back
	// (files in the cluster's directory stay for reading after a failure).
	Undo func() error
}

// StepError is the error of a step's Do or Undo: it names the step, so an
// error from Up says which part of the start-up failed, and errors.As
// finds the step without reading the message.
type StepError struct {
	// Step is the step's name.
	Step string
	// Undo is true when the error came from the step's undo.
	Undo bool
	// Err is the step's error.
	Err error
}

func (e *StepError) Error() string {
	if e.Undo {
		return fmt.Sprintf("undoing step %q: %v", e.Step, e.Err)
	}
	return fmt.Sprintf("step %q: %v", e.Step, e.Err)
}

// Unwrap returns the step's error, for errors.Is and errors.As.
func (e *StepError) Unwrap() error { return e.Err }

// Change is one thing the launcher did to the host: a process it started
// (each run of a supervised one) or a host setting it changed. Every one
// is recorded, in memory and in the cluster directory's changes.log, so
// that what a crashed launcher left behind can be found and undone by
// hand.
type Change struct {
	// At is when the change was made.
	At time.Time
	// Step is the step that made it.
	Step string
	// Kind is "pid" for a process, "setting" for a host setting, "lock"
	// for the directory's lock.
	Kind string
	// What describes the change: the process's name, or the setting and
	// its value.
	What string
	// PID is the process's id, for Kind "pid".
	PID int
}

func (ch Change) String() string {
	if ch.Kind == "pid" {
		return fmt.Sprintf("%s %s %s: %s pid %d", ch.At.UTC().Format(time.RFC3339Nano), ch.Step, ch.Kind, ch.What, ch.PID)
	}
	return fmt.Sprintf("%s %s %s: %s", ch.At.UTC().Format(time.RFC3339Nano), ch.Step, ch.Kind, ch.What)
}

// steps runs Steps and remembers the ones that ran, for undoing them.
type steps struct {
	log *slog.Logger
	dir string // the cluster's directory, for changes.log

	mu      sync.Mutex
	done    []Step
	current string // the step running now, for the changes it records
	changes []Change
}

// run performs s and, when it succeeds, keeps it for undo. A step that
// failed is undone too when it has an undo: it may have half happened
// (a process started that never became ready), and undos are written to
// cope with that.
func (r *steps) run(ctx context.Context, s Step) error {
	r.mu.Lock()
	r.current = s.Name
	r.mu.Unlock()
	r.log.Debug("Step", "step", s.Name)
	err := ctx.Err()
	if err == nil {
		err = s.Do(ctx)
	}
	r.mu.Lock()
	r.done = append(r.done, s)
	r.current = ""
	r.mu.Unlock()
	if err != nil {
		return &StepError{Step: s.Name, Err: err}
	}
	return nil
}

// add keeps s for undo without running anything: a step whose work was
// done elsewhere, such as a process started after Up returned.
func (r *steps) add(s Step) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = append(r.done, s)
}

// undo takes back every step that ran, last first, and returns their
// errors joined, each naming its step. It goes on past a failed undo:
// stopping what can be stopped matters more than the first error.
func (r *steps) undo() error {
	r.mu.Lock()
	done := r.done
	r.done = nil
	r.mu.Unlock()
	var errs []error
	for i := len(done) - 1; i >= 0; i-- {
		s := done[i]
		if s.Undo == nil {
			continue
		}
		if err := s.Undo(); err != nil {
			r.log.Error("Undoing a step", "step", s.Name, "err", err)
			errs = append(errs, &StepError{Step: s.Name, Undo: true, Err: err})
		}
	}
	return errors.Join(errs...)
}

// record notes a change to the host made by the step running now (or by
// step when given, for changes made after start-up).
func (r *steps) record(step, kind, what string, pid int) {
	r.mu.Lock()
	if step == "" {
		step = r.current
	}
	ch := Change{At: time.Now(), Step: step, Kind: kind, What: what, PID: pid}
	r.changes = append(r.changes, ch)
	r.mu.Unlock()
	if r.dir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(r.dir, "changes.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	_, _ = fmt.Fprintln(f, ch.String())
	_ = f.Close()
}

// names returns the names of the steps that ran, in order.
func (r *steps) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.done))
	for i, s := range r.done {
		out[i] = s.Name
	}
	return out
}
