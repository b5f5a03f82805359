//go:build !linux

package executor

// stackLimit is unknown where tasks cannot run.
func stackLimit() int64 { return -1 }
