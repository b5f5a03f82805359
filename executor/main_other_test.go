//go:build !linux

package executor

func setupTestProcess() {}
