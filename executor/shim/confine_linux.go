//go:build linux

package shim

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/sys/unix"
)

// DeniedSyscalls are refused with EPERM by the task's seccomp filter: the
// ways to reach another process's memory, the kernel's key store, BPF,
// kernel modules and kexec, and the mount and namespace machinery a task
// never needs.
var DeniedSyscalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev",
	"mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
	"move_mount", "open_tree", "mount_setattr",
	"keyctl", "add_key", "request_key",
	"bpf", "perf_event_open", "userfaultfd",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"setns", "open_by_handle_at", "name_to_handle_at",
}

// seccompPolicy is the filter: allow by default, DeniedSyscalls fail with
// EPERM, unshare and clone fail with EPERM when asked for a new user
// namespace, and clone3, whose flags a filter cannot read, fails with
// ENOSYS (SECCOMP_RET_TRACE without a tracer, and ptrace is denied) so
// that C libraries fall back to clone.
func seccompPolicy() seccomp.Policy {
	newUser := []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_NEWUSER}}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: DeniedSyscalls},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "unshare", Conditions: newUser},
				{Name: "clone", Conditions: newUser},
			}},
			{Action: seccomp.ActionTrace, Names: []string{"clone3"}},
		},
	}
}

// seccompStep installs the filter on every thread of the shim (TSYNC), so
// the shell and everything it starts inherit it. It is the last step: the
// shim's own remaining work (fork, exec, wait, kill) is all allowed.
func seccompStep(st *state) error {
	if !st.cfg.Seccomp {
		return nil
	}
	return seccomp.LoadFilter(seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy:     seccompPolicy(),
	})
}

// devFiles are the device files a task may write to.
var devFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// landlockStep restricts the file system to what the mounts already allow
// (read and execute everywhere, write in the working directory, /tmp,
// /dev/shm and the usual device files) and, from ABI 6 on, scopes signals
// and abstract Unix sockets to the task's own domain. Best effort: a kernel
// without Landlock gets the mounts alone.
func landlockStep(st *state) error {
	if !st.cfg.Landlock {
		return nil
	}
	// The file system and the IPC scopes only: the network is the
	// network namespace's business (spec.network), not Landlock's.
	cfg := landlock.V6
	cfg.HandledAccessNet = 0
	err := cfg.BestEffort().Restrict(
		landlock.RODirs("/"),
		landlock.RWDirs(st.cfg.WorkDir, "/tmp", "/dev/shm").IgnoreIfMissing(),
		landlock.RWFiles(devFiles...).IgnoreIfMissing(),
	)
	if err != nil {
		return fmt.Errorf("landlock: %w", err)
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

// SeccompSupported reports whether the kernel offers seccomp filters.
func SeccompSupported() bool { return seccomp.Supported() }
