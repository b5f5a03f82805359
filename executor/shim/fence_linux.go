package shim

import (
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// fence stops a fenced task (Config.LeaseMillis): a goroutine reads the
// lease pipe's renewals with a deadline of one window, and when the
// deadline passes or the pipe's other end closes it marks the task fenced
// and kills every other process of the PID namespace. The shell is started
// after a check of the mark, so a task fenced before its start never runs
// its command.
type fence struct {
	fenced atomic.Bool
}

// watch starts reading renewals from fd, the read end of the lease pipe,
// with window as the longest wait. The descriptor is made non-blocking so
// that the deadline works through the Go runtime's poller.
func (f *fence) watch(fd int, window time.Duration) error {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return err
	}
	pipe := os.NewFile(uintptr(fd), "lease")
	go func() {
		buf := make([]byte, 256)
		for {
			_ = pipe.SetReadDeadline(time.Now().Add(window))
			if _, err := pipe.Read(buf); err != nil {
				break // the window passed without a renewal, or the parent is gone
			}
		}
		f.stop()
	}()
	return nil
}

// stop marks the task fenced and kills every process of the namespace but
// the shim (kill(2) with pid -1 from the namespace's init); the shim's
// wait loop then reaps them and reports the shell's SIGKILL.
func (f *fence) stop() {
	f.fenced.Store(true)
	_ = unix.Kill(-1, unix.SIGKILL)
}

// afterStart kills the task again when it was fenced while its shell
// started: the mark is set before the kill, so a shell forked after a
// kill that missed it finds the mark here.
func (f *fence) afterStart() {
	if f.fenced.Load() {
		_ = unix.Kill(-1, unix.SIGKILL)
	}
}
