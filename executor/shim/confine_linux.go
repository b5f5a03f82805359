//go:build linux

package shim

import (
	"fmt"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// seccompStep installs the Config's filter (assembled once by the agent)
// on this thread (see run), so the shell and everything it starts inherit
// it. It is the last step: the shim's own remaining work (fork without
// namespace flags, exec, wait4, kill, the Go runtime's futexes, memory
// and signal calls) is all allowed.
func seccompStep(st *state) error {
	if st.seccomp == nil || st.rootInside() {
		return nil // a root-inside task's second stage loads it (execInside)
	}
	// no_new_privs, which an unprivileged filter requires, is set by an
	// earlier step.
	return loadFilter(st.seccomp)
}

// devFiles are the device files a task may write to.
var devFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// landlockStep restricts the file system to what the mounts already allow
// (read and execute everywhere, write in the working directory, the home
// directory, /tmp, /dev/shm and the usual device files; in a task's root
// also the image's top-level directories, rootWritable: the rules are
// made after the move into it and name its paths) and, from ABI 6 on, scopes signals
// and abstract Unix sockets to the task's own domain, for this thread (see
// run; landlock_restrict_self(2) without thread synchronization applies to
// the caller). Best effort: a kernel without Landlock gets the mounts
// alone.
func landlockStep(st *state) error {
	if !st.cfg.Landlock {
		return nil
	}
	// The file system and the IPC scopes only: the network is the
	// network namespace's business (spec.network), not Landlock's.
	cfg := landlock.V6
	cfg.HandledAccessNet = 0
	rw := []string{st.cfg.WorkDir, "/tmp", "/dev/shm"}
	if u := st.cfg.User; u != nil {
		rw = append(rw, u.Home)
	}
	if st.cfg.Root != nil {
		rw = append(rw, rootWritable()...)
	}
	if st.cfg.Terminal != nil {
		rw = append(rw, "/dev/pts") // the task's own instance: its terminal by name (tty(1), /proc/self/fd/0)
	}
	files := devFiles
	if ws := st.cfg.Workspace; ws != nil && ws.Carry {
		// The shell's traps write the carry record.
		files = append(files[:len(files):len(files)], CarryPath)
	}
	rwDirs := landlock.RWDirs(rw...)
	if LandlockABI() >= 2 {
		// A rename or a link from one directory to another within the
		// writable hierarchies (a file made in a temporary directory, then
		// moved into place, as pip and setuptools do); without it Landlock
		// refuses each with EXDEV. Not below ABI 2, which has no such
		// right: asking for it there would turn Landlock off altogether
		// (go-landlock's best effort).
		rwDirs = rwDirs.WithRefer()
	}
	fd, flags, err := cfg.BestEffort().NewRulesetFD(
		landlock.RODirs("/"),
		rwDirs.IgnoreIfMissing(),
		landlock.RWFiles(files...).IgnoreIfMissing(),
	)
	if err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	if fd < 0 {
		return nil // no Landlock in this kernel
	}
	if st.rootInside() {
		// Applied by the second stage, in the task's user namespace: the
		// shim's binary it executes lies outside the rules' hierarchies.
		st.landlock = landlockRuleset{fd: fd, flags: flags}
		return nil
	}
	defer unix.Close(fd)
	// no_new_privs, which Landlock requires of the caller, is set by the
	// step before.
	if err := llsyscall.LandlockRestrictSelf(fd, flags); err != nil {
		return fmt.Errorf("landlock_restrict_self: %w", err)
	}
	return nil
}

// LandlockABI is the Landlock ABI version the kernel offers, 0 when it has
// none or Landlock is disabled.
func LandlockABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}
