//go:build !linux

package agent

// The executor runs tasks only on Linux; elsewhere there is never a process
// to find or stop.

func bootID() string { return "" }

func stopLeftovers(processRecord, string) (int, error) { return 0, nil }
