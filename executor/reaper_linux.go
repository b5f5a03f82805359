//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaping design.
//
// A child subreaper (PR_SET_CHILD_SUBREAPER) becomes the parent of every
// process orphaned below it, and each of those stays a zombie until the
// subreaper waits for it. A loop calling wait4(-1) reaps them, but it also
// takes the exit status of a shell that another goroutine is waiting for
// through os/exec or a pidfd: that waiter then fails with ECHILD and the
// task's exit code is lost. Peeking with waitid(P_ALL, WNOWAIT) avoids the
// theft but spins while a known child's zombie waits for its owner.
//
// So, as in containerd's reaper, one loop owns every wait of the process:
// on SIGCHLD it calls wait4(-1, WNOHANG) until no zombie is left and hands
// the status of a tracked pid to the channel registered for it; any other
// pid is an orphan and is simply released. Start forks and registers its
// pid while holding the same mutex the loop holds around each wait4 and
// lookup. That closes both races: a shell that exits at once is reaped only
// after its channel exists, and a pid the loop has just reaped cannot be
// handed to a new fork and matched with the old status in between.
//
// Being a subreaper is a property of the whole process, so this is
// process-wide state by necessity, set once by BecomeSubreaper. Until then
// (and in processes that never call it) each task waits for its own shell
// through its pidfd, and nothing reaps foreign children.

// exitStatus is what a wait returned for one shell.
type exitStatus struct {
	status unix.WaitStatus
	err    error // the status was lost (another waiter took it)
}

type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan<- exitStatus
	sigs    chan os.Signal
	orphans atomic.Int64
}

var (
	modeMu       sync.Mutex
	activeReaper *reaper // set once by BecomeSubreaper
	directWaits  int     // tasks waiting through their pidfd
)

// BecomeSubreaper makes the calling process a child subreaper
// (prctl(PR_SET_CHILD_SUBREAPER), Linux 3.4) and starts the process's single
// reaper loop, so every process a task orphans is re-parented to this
// process and reaped. Call it once, early, before starting tasks; later
// calls return nil. Afterwards the process must not start children through
// os/exec or os.StartProcess outside this package: the reaper would take
// their exit status. It returns ErrTasksRunning when tasks started before it
// are still running, or the prctl error.
func BecomeSubreaper() error {
	modeMu.Lock()
	defer modeMu.Unlock()
	if activeReaper != nil {
		return nil
	}
	if directWaits > 0 {
		return fmt.Errorf("becoming a child subreaper: %d %w without the reaper", directWaits, ErrTasksRunning)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("becoming a child subreaper: prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	r := &reaper{waiters: make(map[int]chan<- exitStatus), sigs: make(chan os.Signal, 1)}
	signal.Notify(r.sigs, unix.SIGCHLD)
	// One pass for zombies that exist already: their SIGCHLD came before
	// Notify.
	r.sigs <- unix.SIGCHLD
	go r.loop()
	activeReaper = r
	return nil
}

// IsSubreaper reports whether BecomeSubreaper succeeded in this process.
func IsSubreaper() bool {
	modeMu.Lock()
	defer modeMu.Unlock()
	return activeReaper != nil
}

// OrphansReaped counts the processes the reaper released that were not the
// shell of a task (orphans re-parented to this process); 0 without
// BecomeSubreaper.
func OrphansReaped() int64 {
	modeMu.Lock()
	r := activeReaper
	modeMu.Unlock()
	if r == nil {
		return 0
	}
	return r.orphans.Load()
}

// loop runs for the life of the process. SIGCHLD deliveries coalesce, so
// each wake-up reaps until no zombie is left.
func (r *reaper) loop() {
	for range r.sigs {
		r.reapAll()
	}
}

func (r *reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		r.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			r.mu.Unlock()
			continue
		}
		if err != nil || pid <= 0 {
			// ECHILD: no children at all; 0: none has exited yet.
			r.mu.Unlock()
			return
		}
		ch, tracked := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if tracked {
			ch <- exitStatus{status: ws} // buffered, never blocks
		} else {
			r.orphans.Add(1)
		}
	}
}

// startWaited starts a process with start and returns its start time in
// clock ticks after boot (0 if unknown) and a channel that receives its exit
// status exactly once: from the reaper when the process is a subreaper, from
// a pidfd wait otherwise. The start time is read while the process cannot
// have been reaped yet (a zombie keeps its /proc/<pid>/stat), so it belongs
// to the process started here and not to a later one that reused the pid.
func startWaited(start func() (*os.Process, error)) (*os.Process, uint64, <-chan exitStatus, error) {
	modeMu.Lock()
	r := activeReaper
	if r == nil {
		directWaits++
	}
	modeMu.Unlock()

	ch := make(chan exitStatus, 1)
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		p, err := start()
		if err != nil {
			return nil, 0, nil, err
		}
		r.waiters[p.Pid] = ch
		return p, startTicksOf(p.Pid), ch, nil
	}

	doneDirect := func() {
		modeMu.Lock()
		directWaits--
		modeMu.Unlock()
	}
	p, err := start()
	if err != nil {
		doneDirect()
		return nil, 0, nil, err
	}
	// Before the waiter below exists nothing can reap the process.
	ticks := startTicksOf(p.Pid)
	go func() {
		ps, err := p.Wait()
		doneDirect()
		if err != nil {
			ch <- exitStatus{err: fmt.Errorf("waiting for pid %d: %w", p.Pid, err)}
			return
		}
		ws, ok := ps.Sys().(syscall.WaitStatus)
		if !ok {
			ch <- exitStatus{err: errors.New("wait status of unexpected type")}
			return
		}
		ch <- exitStatus{status: unix.WaitStatus(ws)}
	}()
	return p, ticks, ch, nil
}

// startTicksOf reads the start time of pid, 0 when it cannot be read.
func startTicksOf(pid int) uint64 {
	st, ok := readProcStat(pid)
	if !ok {
		return 0
	}
	return st.startTicks
}
