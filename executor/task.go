package executor

import (
	"context"
	"sync"
)

// Start runs the pre-start checks, creates the spill files and starts the
// shell; it returns once the shell exists. The error is a [*StartError]
// (reason StartFailed) and nothing of the command ran. The returned Task
// ends on its own; Cancel stops it early.
func (e *Executor) Start(spec Spec) (*Task, error) {
	p, err := e.prepare(spec)
	if err != nil {
		return nil, err
	}
	t, err := e.start(p)
	if err != nil {
		p.cleanupDirs()
		return nil, err
	}
	return t, nil
}

// Task is a running or finished task.
type Task struct {
	spec   *prepared
	exec   *Executor
	stdout *stream
	stderr *stream
	order  *orderJournal

	cancelOnce sync.Once
	cancel     chan struct{}
	done       chan struct{}
	result     Result // written once before done is closed

	stdin *stdinFeeder // nil unless Spec.StdinStream
	term  *Terminal    // nil unless Spec.Terminal

	sys taskSys // platform part
}

// Cancel asks the task to stop (SIGTERM, grace, SIGKILL). A task whose
// shell already exited is not affected: its reason stays what it was.
// Cancel is idempotent and does not wait; use Wait or Done.
func (t *Task) Cancel() {
	t.cancelOnce.Do(func() { close(t.cancel) })
}

// Done is closed when the task is over: every process stopped, all output
// read, the cgroup removed.
func (t *Task) Done() <-chan struct{} { return t.done }

// Wait blocks until the task is over and returns its Result, or returns
// ctx's error if ctx ends first (the task keeps running).
func (t *Task) Wait(ctx context.Context) (Result, error) {
	select {
	case <-t.done:
		return t.result, nil
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// Result returns the task's Result and true once the task is over, a zero
// Result and false before.
func (t *Task) Result() (Result, bool) {
	select {
	case <-t.done:
		return t.result, true
	default:
		return Result{}, false
	}
}

// Snapshot returns the output so far; it may be called at any time, also
// after the task ended.
func (t *Task) Snapshot() Snapshot {
	return Snapshot{Stdout: t.stdout.snapshot(), Stderr: t.stderr.snapshot()}
}

// OutputState is one stream's progress as a reader of its spill file sees
// it (Task.Output).
type OutputState struct {
	// SpillPath is the spill file; it exists once the stream's first byte
	// was written.
	SpillPath string
	// SpillBytes is how many bytes the spill file holds and a reader may
	// read now: the stream's first bytes, at most SpillLimitBytes.
	SpillBytes int64
	// TotalBytes is how many bytes the command wrote to the stream so far.
	TotalBytes int64
	// SpillLimitBytes is the cap on the spill file ([Spec.SpillLimitBytes]).
	SpillLimitBytes int64
	// SpillFailed is true when writing the spill file failed: it stops at
	// SpillBytes although the stream may go on.
	SpillFailed bool
	// Ended is true once the stream was read to its end: TotalBytes and
	// SpillBytes are final.
	Ended bool
}

// Output returns stdout's (stderr false) or stderr's state and a channel
// closed at the stream's next change (bytes appended or the stream's end),
// nil once it has ended. A follower waits on the channel instead of polling
// the file; the writer pays one check per chunk while nobody waits.
func (t *Task) Output(stderr bool) (OutputState, <-chan struct{}) {
	if stderr {
		return t.stderr.output()
	}
	return t.stdout.output()
}

// SpillDir is the directory holding the task's spill files.
func (t *Task) SpillDir() string { return t.spec.SpillDir }

// WorkingDir is the directory the shell started in: [Spec.WorkingDir], or
// when that was empty the fresh directory the executor created under
// [Config.WorkDirRoot] and removes when the task ends.
func (t *Task) WorkingDir() string { return t.spec.WorkingDir }
