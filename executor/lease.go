package executor

import (
	"os"
	"sync"
	"time"
)

// Lease is a node's right to run the tasks of its workspaces, fenced
// against a second copy of a workspace on another node (docs/workspaces.md,
// "Node lost").
//
// The controller restores a workspace on another node once it has not
// heard from the workspace's agent for its --agent-lost-after. A stopped
// agent or a network partition does not stop the tasks, so a workspace
// task must stop on its own first. The agent holds the lease while a
// controller watches it and extends it to the time the last watch ended
// plus the window the controller gave; the executor renews every fenced
// task's shim (one byte on a pipe, every quarter window) only while the
// lease runs at least one window ahead. A shim that has had no renewal for
// one window, or whose pipe closed (the agent died), kills every process
// of its task with SIGKILL, so a task ends at most one window after the
// last watch ended or the agent stopped, whichever came first, and before
// the controller may restore the workspace elsewhere as long as the window
// is shorter than --agent-lost-after.
//
// A nil *Lease, or one of window 0, fences nothing. Its methods are safe
// for concurrent use.
type Lease struct {
	mu     sync.Mutex
	window time.Duration
	until  time.Time // on the monotonic clock
	holds  map[*os.File]time.Duration
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// NewLease returns a lease of no window, expired, and starts its renewal
// loop; Close stops it.
func NewLease() *Lease {
	l := &Lease{holds: map[*os.File]time.Duration{}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.renewLoop()
	return l
}

// Extend sets the window (how long a fenced task runs without a renewal;
// 0 stops fencing new tasks) and moves the lease's end to until when that
// is later than its end so far: a lease is never shortened.
func (l *Lease) Extend(window time.Duration, until time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.window = window
	if until.After(l.until) {
		l.until = until
	}
	l.mu.Unlock()
	l.poke()
}

// Window is the window new fenced tasks get, 0 for none.
func (l *Lease) Window() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.window
}

// Held reports whether the lease runs at least window ahead of now: a
// fenced task may start, and its shim is renewed.
func (l *Lease) Held(window time.Duration) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Until(l.until) >= window
}

// Until is the lease's end on the local monotonic clock; the zero time
// before any Extend.
func (l *Lease) Until() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// hold renews w, the write end of a fenced task's lease pipe, with the
// task's window until release.
func (l *Lease) hold(w *os.File, window time.Duration) {
	l.mu.Lock()
	l.holds[w] = window
	l.mu.Unlock()
	l.poke()
}

// poke wakes the renewal loop: a renewal for every held pipe now, and
// the next after a quarter of the shortest window.
func (l *Lease) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// release stops renewing w and closes it.
func (l *Lease) release(w *os.File) {
	l.mu.Lock()
	delete(l.holds, w)
	l.mu.Unlock()
	w.Close()
}

// Close stops the renewal loop; the shims it renewed stop their tasks one
// window later.
func (l *Lease) Close() {
	if l == nil {
		return
	}
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// renewLoop writes one byte to every held pipe whose task's window the
// lease still covers, every quarter of the shortest window held, and
// when Extend wakes it.
func (l *Lease) renewLoop() {
	defer close(l.done)
	tick := time.NewTimer(time.Second)
	defer tick.Stop()
	one := []byte{0}
	for {
		select {
		case <-l.stop:
			return
		case <-l.wake:
		case <-tick.C:
		}
		l.mu.Lock()
		left := time.Until(l.until)
		next := time.Second
		for w, window := range l.holds {
			if left >= window {
				// Bounded: a full pipe (a shim that stopped reading, 64
				// KiB of renewals behind) holds renewals enough, and a
				// shim that is gone fails the write with EPIPE.
				_ = w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				_, _ = w.Write(one)
			}
			next = min(next, window/4)
		}
		l.mu.Unlock()
		if !tick.Stop() {
			select {
			case <-tick.C:
			default:
			}
		}
		tick.Reset(max(next, 10*time.Millisecond))
	}
}
