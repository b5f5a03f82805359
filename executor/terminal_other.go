//go:build !linux

package executor

import "os"

// resizeTerminal returns ErrUnsupported outside Linux, where no task
// starts.
func resizeTerminal(*os.File, WindowSize) error { return ErrUnsupported }

// isTerminalGone is always false outside Linux.
func isTerminalGone(error) bool { return false }
