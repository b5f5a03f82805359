//go:build !linux

package seccomp

// Supported is false: seccomp is Linux only.
func Supported() bool { return false }
