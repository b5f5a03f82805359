//go:build linux

package shim

import (
	"fmt"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/landlock-lsm/go-landlock/landlock"
	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/net/bpf"
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
//
// The signals a task can send its shim (PID 1 of its namespace) with a
// code of its choosing fail with EPERM too: rt_sigqueueinfo and
// rt_tgsigqueueinfo to pid 1, pidfd_send_signal with a siginfo (a pidfd
// of pid 1 is one pidfd_open away), and fcntl F_SETSIG, which makes the
// kernel send a chosen signal to a file's owner (F_SETOWN 1) with a
// kernel code. The Go runtime takes a SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGTRAP, SIGSTKFLT or SIGSYS that does not carry kill(2)'s or tkill(2)'s
// code for a fault of its own and crashes, whatever signal.Notify asked
// for; kill, tkill and tgkill, which the shim catches, stay allowed, as do
// queued signals to the task's other processes.
func seccompPolicy() seccomp.Policy {
	newUser := []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_NEWUSER}}
	toPID1 := []seccomp.Condition{{Argument: 0, Operation: seccomp.Equal, Value: 1}}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: DeniedSyscalls},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "unshare", Conditions: newUser},
				{Name: "clone", Conditions: newUser},
				{Name: "rt_sigqueueinfo", Conditions: toPID1},
				{Name: "rt_tgsigqueueinfo", Conditions: toPID1},
				{Name: "pidfd_send_signal", Conditions: []seccomp.Condition{{Argument: 2, Operation: seccomp.NotEqual, Value: 0}}},
				{Name: "fcntl", Conditions: []seccomp.Condition{
					{Argument: 1, Operation: seccomp.Equal, Value: unix.F_SETSIG},
					{Argument: 2, Operation: seccomp.NotEqual, Value: 0},
				}},
			}},
			{Action: seccomp.ActionTrace, Names: []string{"clone3"}},
		},
	}
}

// assembleSeccomp assembles the filter of seccompPolicy into the kernel's
// form, behind a first check that refuses, with ENOSYS, every system call
// made through another architecture's interface than the agent's own (the
// 32-bit int 0x80 entry on x86-64, AArch32 on arm64): the policy's
// library lets those through untouched, and they reach unshare and keyctl
// under other numbers.
func assembleSeccomp() ([]unix.SockFilter, error) {
	policy := seccompPolicy()
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp policy: %w", err)
	}
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("the seccomp policy's architecture: %w", err)
	}
	const archOffset = 4 // struct seccomp_data: int nr; __u32 arch; ...
	insts = append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: archOffset, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(native.ID), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
	}, insts...)
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return prog, nil
}

// seccompStep installs the filter, assembled before the Config arrived,
// on this thread (see run), so the shell and everything it starts inherit
// it. It is the last step: the shim's own remaining work (fork, exec,
// wait, kill) is all allowed.
func seccompStep(st *state) error {
	if !st.cfg.Seccomp {
		return nil
	}
	// no_new_privs, which an unprivileged filter requires, is set by an
	// earlier step.
	prog := unix.SockFprog{Len: uint16(len(st.seccomp)), Filter: &st.seccomp[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("loading the seccomp filter: %w", e)
	}
	return nil
}

// devFiles are the device files a task may write to.
var devFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// landlockStep restricts the file system to what the mounts already allow
// (read and execute everywhere, write in the working directory, the home
// directory, /tmp, /dev/shm and the usual device files) and, from ABI 6 on, scopes signals
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
	fd, flags, err := cfg.BestEffort().NewRulesetFD(
		landlock.RODirs("/"),
		landlock.RWDirs(rw...).IgnoreIfMissing(),
		landlock.RWFiles(devFiles...).IgnoreIfMissing(),
	)
	if err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	if fd < 0 {
		return nil // no Landlock in this kernel
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

// SeccompSupported reports whether the kernel offers seccomp filters.
func SeccompSupported() bool { return seccomp.Supported() }
