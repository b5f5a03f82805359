//go:build linux

package executor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/procfs"
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
// on SIGCHLD it calls wait4(-1, WNOHANG) until no zombie is left and, under
// the reaper's mutex, hands the status of a registered pid to the channel
// registered for it. A status nobody registered is kept for a while in
// r.unclaimed with a reap sequence number, because it may belong to a shell
// whose Start has forked but not registered yet: forking under the mutex
// would make that impossible but serialise every start behind one fork.
// Two races must stay closed:
//
//   - A shell that exits at once can be reaped before its Start registers
//     it. Its status then waits in r.unclaimed, and Start takes it there.
//   - A pid that was reaped can be handed to a new fork, so a status kept
//     under that pid may be an earlier process's. Start notes the reap
//     sequence number before it forks: a status reaped no later than that
//     is never the new shell's, since the shell did not exist yet. A status
//     reaped after it is normally the shell's; it is an earlier process's
//     only if that process was reaped during the fork itself and the kernel
//     gave its pid straight to the new shell. The pidfd the fork returns
//     (CLONE_PIDFD) settles that case exactly: waitid(P_PIDFD, WNOWAIT)
//     fails with ECHILD only once the new shell itself has been reaped, so
//     with a pidfd Start takes a kept status only then (the latest one
//     kept for the pid, which is the shell's unless the pid was handed out
//     and reaped once more within that window, a full wrap of the kernel's
//     pid counter) and otherwise drops it as stale. Kernels without pidfds
//     (before 5.4) rely on the sequence number alone, which leaves the
//     reaped-during-the-fork case open there.
//
// Start looks up and registers under the same mutex the loop holds around
// each wait4 and lookup, so no status is delivered between the two, and it
// reads the shell's start time there too: a shell not yet reaped cannot be
// reaped while Start holds the mutex, so /proc/<pid>/stat is its own (a
// zombie keeps it). Kept statuses are dropped after unclaimedTTL, oldest
// first, unless a Start that began before their reap is still in flight
// and might claim them; the set is bounded by what is reaped in that time.
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

// unclaimedTTL is how long the status of a reaped pid that nobody
// registered is kept for a Start that forked it and has not registered it
// yet (a few microseconds normally; far longer on an overloaded node).
const unclaimedTTL = 10 * time.Second

type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan<- exitStatus
	// seq counts reaped processes; a status's seq is the count after it.
	seq uint64
	// unclaimed holds the latest unregistered status per pid; queue holds
	// the same entries in reap order for pruning (an entry whose map value
	// has a different seq was claimed or replaced).
	unclaimed map[int]reaped
	queue     []queuedReap
	// inflight counts the Starts between their fork and their
	// registration, by the seq they noted before forking.
	inflight map[uint64]int
	sigs     chan os.Signal
	orphans  atomic.Int64
}

// reaped is a status the loop took for a pid nobody had registered.
type reaped struct {
	status unix.WaitStatus
	seq    uint64
	at     time.Time // monotonic, for unclaimedTTL
}

type queuedReap struct {
	pid int
	seq uint64
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
	r := &reaper{
		waiters:   make(map[int]chan<- exitStatus),
		unclaimed: make(map[int]reaped),
		inflight:  make(map[uint64]int),
		sigs:      make(chan os.Signal, 1),
	}
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
// BecomeSubreaper. A shell reaped before its task registered it is counted
// until the task claims its status.
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
			r.pruneLocked(time.Now())
			r.mu.Unlock()
			return
		}
		r.seq++
		ch, tracked := r.waiters[pid]
		if tracked {
			delete(r.waiters, pid)
		} else {
			// An orphan, or a shell whose Start has not registered it
			// yet; the latest status per pid is the one a Start may want.
			r.unclaimed[pid] = reaped{status: ws, seq: r.seq, at: time.Now()}
			r.queue = append(r.queue, queuedReap{pid: pid, seq: r.seq})
		}
		r.mu.Unlock()
		if tracked {
			ch <- exitStatus{status: ws} // buffered, never blocks
		} else {
			r.orphans.Add(1)
		}
	}
}

// pruneLocked drops kept statuses older than unclaimedTTL, oldest first,
// stopping at the first one a Start still in flight might claim.
func (r *reaper) pruneLocked(now time.Time) {
	oldestStart := uint64(math.MaxUint64)
	for before := range r.inflight {
		oldestStart = min(oldestStart, before)
	}
	n := 0
	for _, q := range r.queue {
		e, ok := r.unclaimed[q.pid]
		if ok && e.seq == q.seq {
			if q.seq > oldestStart || now.Sub(e.at) < unclaimedTTL {
				break
			}
			delete(r.unclaimed, q.pid)
		}
		n++
	}
	if n > 0 {
		r.queue = slices.Delete(r.queue, 0, n)
	}
}

// beginStart notes the reap sequence number before a fork.
func (r *reaper) beginStart() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight[r.seq]++
	return r.seq
}

// endStart ends what beginStart began, for a fork that failed.
func (r *reaper) endStart(before uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endStartLocked(before)
}

func (r *reaper) endStartLocked(before uint64) {
	if r.inflight[before]--; r.inflight[before] <= 0 {
		delete(r.inflight, before)
	}
}

// register makes ch receive the exit status of pid, forked after the reap
// sequence number was before; pidfd is the fork's pidfd or -1. When the
// shell was reaped already its kept status is sent at once. It returns the
// shell's start time in clock ticks, 0 when it was reaped already.
func (r *reaper) register(pid, pidfd int, before uint64, ch chan<- exitStatus) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endStartLocked(before)
	e, kept := r.unclaimed[pid]
	// Only a status reaped after the fork began can be the shell's.
	mine := kept && e.seq > before
	reapedAlready, known := pidfdReaped(pidfd)
	if !known {
		reapedAlready = mine
	}
	if reapedAlready {
		if !mine {
			// Not expected: a status a Start in flight may claim is never
			// pruned. Reported rather than waited for forever.
			ch <- exitStatus{err: fmt.Errorf("exit status of pid %d lost: reaped, but not kept", pid)}
			return 0
		}
		delete(r.unclaimed, pid)
		r.orphans.Add(-1)
		ch <- exitStatus{status: e.status} // buffered, never blocks
		return 0
	}
	if kept {
		// An earlier process that had the same pid.
		delete(r.unclaimed, pid)
	}
	r.waiters[pid] = ch
	return startTicksOf(pid)
}

// pidfdReaped asks the kernel whether the process of pidfd, a child of this
// process, has been reaped: waitid(P_PIDFD, WNOHANG|WNOWAIT) reports a live
// or zombie child without reaping it and fails with ECHILD once it was
// reaped. known is false without a pidfd or without P_PIDFD (Linux 5.4).
func pidfdReaped(pidfd int) (gone, known bool) {
	if pidfd < 0 {
		return false, false
	}
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		switch {
		case err == nil:
			return false, true
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			return true, true
		default:
			return false, false
		}
	}
}

// afterForkHook, when set, runs in subreaper mode between a fork and its
// registration. Tests use it to widen that window; nil otherwise.
var afterForkHook atomic.Pointer[func(pid int)]

// startWaited starts a process with start and returns its start time in
// clock ticks after boot (0 if unknown) and a channel that receives its exit
// status exactly once: from the reaper when the process is a subreaper, from
// a pidfd wait otherwise. start receives where to store the child's pidfd
// (syscall.SysProcAttr.PidFD), or nil when none is needed. The start time
// is read while the process cannot have been reaped yet (a zombie keeps its
// /proc/<pid>/stat), so it belongs to the process started here and not to a
// later one that reused the pid.
func startWaited(start func(pidfd *int) (*os.Process, error)) (*os.Process, uint64, <-chan exitStatus, error) {
	modeMu.Lock()
	r := activeReaper
	if r == nil {
		directWaits++
	}
	modeMu.Unlock()

	ch := make(chan exitStatus, 1)
	if r != nil {
		// No lock across the fork: see the design comment at the top.
		before := r.beginStart()
		pidfd := -1
		p, err := start(&pidfd)
		if err != nil {
			r.endStart(before)
			return nil, 0, nil, err
		}
		if h := afterForkHook.Load(); h != nil {
			(*h)(p.Pid)
		}
		ticks := r.register(p.Pid, pidfd, before, ch)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return p, ticks, ch, nil
	}

	doneDirect := func() {
		modeMu.Lock()
		directWaits--
		modeMu.Unlock()
	}
	p, err := start(nil)
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
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.StartTicks
}

// helperOutputLimit bounds the output runHelper keeps (bytes); the rest is
// read and dropped, so a chatty helper cannot block on a full pipe.
const helperOutputLimit = 64 << 10

// runHelper runs a program of the executor's own (mkfs.ext4) to its end
// and returns its standard output and error together, the first
// helperOutputLimit bytes of them. It waits through startWaited, as for
// tasks: when the process is a subreaper the reaper's loop owns every wait
// of the process, and exec.Cmd's own wait would find its child already
// reaped ("waitid: no child processes"). A helper that does not exit 0 is
// an error naming its status.
func runHelper(path string, args ...string) ([]byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return nil, err
	}
	sys := &syscall.SysProcAttr{}
	attr := &os.ProcAttr{
		Env:   []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"},
		Files: []*os.File{devNull, w, w},
		Sys:   sys,
	}
	p, _, exitCh, err := startWaited(func(pidfd *int) (*os.Process, error) {
		sys.PidFD = pidfd
		return os.StartProcess(path, append([]string{path}, args...), attr)
	})
	w.Close()
	devNull.Close()
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Release() }()
	var out bytes.Buffer
	_, _ = io.Copy(&out, io.LimitReader(r, helperOutputLimit))
	_, _ = io.Copy(io.Discard, r)
	st := <-exitCh
	switch {
	case st.err != nil:
		return out.Bytes(), st.err
	case st.status.Signaled():
		return out.Bytes(), fmt.Errorf("killed by %v", st.status.Signal())
	case st.status.ExitStatus() != 0:
		return out.Bytes(), fmt.Errorf("exit status %d", st.status.ExitStatus())
	}
	return out.Bytes(), nil
}
