//go:build !linux

package executor

import "time"

// pauseReader waits d (tasks do not run on this platform).
func pauseReader(d time.Duration) { time.Sleep(d) }
