//go:build !linux

package nodeimages

import "os/exec"

// stopGroupOnCancel leaves cmd as it is: only Linux builds the agent's root
// file system, the one step whose commands start processes of their own.
func stopGroupOnCancel(*exec.Cmd) {}

// unmountUnder does nothing: no mounts are made outside Linux.
func unmountUnder(string) error { return nil }
