package executor

import (
	"time"

	"golang.org/x/sys/unix"
)

// pauseReader blocks the reader's thread for d. nanosleep(2) keeps the
// wait as short as asked; time.Sleep of less than a millisecond rounds
// up in the runtime's poller, and waking the goroutine through it cost
// more context switches than it saved.
func pauseReader(d time.Duration) {
	_ = unix.Nanosleep(&unix.Timespec{Nsec: d.Nanoseconds()}, nil)
}
