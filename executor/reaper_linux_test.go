//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// setAfterForkHook installs h for the rest of the test. Only tests that are
// not parallel use it, so no other test's starts pass through it.
func setAfterForkHook(t *testing.T, h func(pid int)) {
	t.Helper()
	if !IsSubreaper() {
		t.Skip("needs BecomeSubreaper (running in direct-wait mode)")
	}
	afterForkHook.Store(&h)
	t.Cleanup(func() { afterForkHook.Store(nil) })
}

// A shell that exits and is reaped before its Start registered it still
// gets its own status. The hook holds the Start until the reaper has taken
// the zombie (its /proc entry is gone).
func TestReaperShellReapedBeforeRegistration(t *testing.T) {
	var reapedFirst bool
	setAfterForkHook(t, func(pid int) {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); errors.Is(err, os.ErrNotExist) {
				reapedFirst = true
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	ex := newTestExecutor(t, CgroupAuto)
	for _, code := range []int{0, 7, 255} {
		reapedFirst = false
		task, err := ex.Start(testSpec(t, fmt.Sprintf("exit %d", code)))
		if err != nil {
			t.Fatal(err)
		}
		if !reapedFirst {
			t.Fatalf("exit %d: the shell was not reaped before its registration; the test proves nothing", code)
		}
		if task.ProcessStart() != 0 {
			t.Errorf("exit %d: ProcessStart() = %d for a shell reaped before it was read, want 0", code, task.ProcessStart())
		}
		if res := wait(t, task); res.ExitCode != code || res.Signal != "" {
			t.Errorf("exit %d: got exit code %d signal %q (%s)", code, res.ExitCode, res.Signal, res.Message)
		}
	}
}

// Starts do not wait for each other: while one Start is held between its
// fork and its registration, another starts, runs and ends; then the first
// one still gets its own status.
func TestReaperStartsDoNotWaitForEachOther(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	// Not a sync.Once: its Do would make the second Start wait for the
	// first.
	var first atomic.Bool
	setAfterForkHook(t, func(int) {
		if first.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	})
	ex := newTestExecutor(t, CgroupAuto)
	firstTask := make(chan *Task, 1)
	go func() {
		task, err := ex.Start(testSpec(t, "exit 5"))
		if err != nil {
			t.Error(err)
		}
		firstTask <- task
	}()
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("the first Start never forked")
	}
	res := run(t, ex, testSpec(t, "exit 3"))
	close(release)
	if res.ExitCode != 3 {
		t.Errorf("second task (started while the first was held): exit code %d (%s), want 3", res.ExitCode, res.Message)
	}
	task := <-firstTask
	if task == nil {
		return
	}
	if res := wait(t, task); res.ExitCode != 5 {
		t.Errorf("first task: exit code %d (%s), want 5", res.ExitCode, res.Message)
	}
}

// Many concurrent starts, each exiting at once with its own code while
// orphans are reaped in between: every status reaches its own task.
func TestReaperConcurrentStartsGetTheirOwnStatus(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	const n = 120
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Go(func() {
			command := fmt.Sprintf("exit %d", i)
			if i%3 == 0 {
				command = fmt.Sprintf("(true &); (true &); exit %d", i)
			}
			task, err := ex.Start(testSpec(t, command))
			if err != nil {
				t.Error(err)
				codes[i] = -2
				return
			}
			codes[i] = wait(t, task).ExitCode
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != i {
			t.Errorf("task %d got exit code %d", i, c)
		}
	}
}

// register's decision, on a reaper of its own: which kept status belongs
// to the newly forked pid.
func TestReaperRegister(t *testing.T) {
	t.Parallel()
	// A live child of this process (a task's shell) and a pidfd that
	// reports "reaped" (this process is not its own child).
	ex := newTestExecutor(t, CgroupOff)
	live, err := ex.Start(testSpec(t, "exec sleep 60"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { live.Cancel(); <-live.Done() }()
	livePidfd, err := unix.PidfdOpen(live.PID(), 0)
	if err != nil {
		t.Skipf("no pidfd_open here: %v", err)
	}
	t.Cleanup(func() { unix.Close(livePidfd) })
	goneFD, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(goneFD) })
	if gone, known := pidfdReaped(livePidfd); gone || !known {
		t.Skipf("waitid(P_PIDFD) unusable here: gone %v known %v", gone, known)
	}

	pid := live.PID()
	const before = 10
	type out struct {
		Status     string // "none", "exit N", or "lost"
		Registered bool
		Kept       bool // a status is still kept for pid
		Orphans    int64
	}
	tests := map[string]struct {
		kept  *uint64 // seq of a kept status (exit 9) for pid; nil for none
		pidfd int
		want  out
	}{
		"nothing kept: registered": {
			pidfd: -1, want: out{"none", true, false, 0},
		},
		"reaped before the fork: stale, dropped": {
			kept: ptrTo[uint64](before), pidfd: -1, want: out{"none", true, false, 0},
		},
		"reaped after the fork began, no pidfd: taken": {
			kept: ptrTo[uint64](before + 1), pidfd: -1, want: out{"exit 9", false, false, -1},
		},
		"reaped after the fork began, but the pidfd's child is alive: an earlier process's, dropped": {
			kept: ptrTo[uint64](before + 1), pidfd: livePidfd, want: out{"none", true, false, 0},
		},
		"the pidfd's child was reaped: taken": {
			kept: ptrTo[uint64](before + 1), pidfd: goneFD, want: out{"exit 9", false, false, -1},
		},
		"the pidfd's child was reaped but nothing is kept: lost, not a hang": {
			pidfd: goneFD, want: out{"lost", false, false, 0},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &reaper{waiters: map[int]chan<- exitStatus{}, unclaimed: map[int]reaped{}, inflight: map[uint64]int{before: 1}, seq: before + 5}
			if tc.kept != nil {
				r.unclaimed[pid] = reaped{status: unix.WaitStatus(9 << 8), seq: *tc.kept, at: time.Now()}
			}
			ch := make(chan exitStatus, 1)
			r.register(pid, tc.pidfd, before, ch)
			got := out{Status: "none", Orphans: r.orphans.Load()}
			select {
			case st := <-ch:
				if st.err != nil {
					got.Status = "lost"
				} else {
					got.Status = fmt.Sprintf("exit %d", st.status.ExitStatus())
				}
			default:
			}
			_, got.Registered = r.waiters[pid]
			_, got.Kept = r.unclaimed[pid]
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if len(r.inflight) != 0 {
				t.Errorf("in-flight starts after register: %v, want none", r.inflight)
			}
		})
	}
}

// Kept statuses are dropped after unclaimedTTL, oldest first, but never
// one a Start still in flight might claim.
func TestReaperPrune(t *testing.T) {
	t.Parallel()
	now := time.Now()
	r := &reaper{unclaimed: map[int]reaped{}, inflight: map[uint64]int{}}
	add := func(pid int, age time.Duration) {
		r.seq++
		r.unclaimed[pid] = reaped{seq: r.seq, at: now.Add(-age)}
		r.queue = append(r.queue, queuedReap{pid: pid, seq: r.seq})
	}
	add(100, 2*unclaimedTTL) // seq 1
	add(101, 2*unclaimedTTL) // seq 2
	add(100, 2*unclaimedTTL) // seq 3: replaces seq 1
	add(102, 2*unclaimedTTL) // seq 4
	add(103, time.Second)    // seq 5: young
	r.inflight[3] = 1        // a Start that forked after seq 3
	r.pruneLocked(now)
	if diff := cmp.Diff([]int{102, 103}, sortedKeys(r.unclaimed)); diff != "" {
		t.Errorf("kept with a Start in flight since seq 3 (-want +got):\n%s", diff)
	}
	delete(r.inflight, 3)
	r.pruneLocked(now)
	if diff := cmp.Diff([]int{103}, sortedKeys(r.unclaimed)); diff != "" {
		t.Errorf("kept with no Start in flight (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]queuedReap{{103, 5}}, r.queue, cmp.AllowUnexported(queuedReap{})); diff != "" {
		t.Errorf("queue (-want +got):\n%s", diff)
	}
	r.pruneLocked(now.Add(unclaimedTTL))
	if len(r.unclaimed) != 0 || len(r.queue) != 0 {
		t.Errorf("after the TTL: kept %v, queue %v; want both empty", r.unclaimed, r.queue)
	}
}

func ptrTo[T any](v T) *T { return &v }

func sortedKeys(m map[int]reaped) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
