//go:build linux

package seccomp

import (
	"encoding/binary"
	"fmt"
	"slices"

	seccompbpf "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The task's seccomp filter is an allow list: a system call the tables
// below do not name is refused. It is generated here, for the agent's own
// architecture, from three tables:
//
//   - [AllowedSyscalls]: calls allowed whatever their arguments;
//   - [argumentRules]: calls allowed or refused by their arguments;
//   - [ENOSYSSyscalls]: calls refused with ENOSYS, so that C libraries
//     fall back to an older call the filter can judge.
//
// Every other call the architecture's table knows is refused with EPERM,
// as a permission refusal; a number the table does not know (a call newer
// than the table, or no call at all) gets ENOSYS, as from a kernel
// without it, so a C library that tries a new call first (faccessat2,
// clone3, statx, close_range were each new once) falls back instead of
// failing. docs/security.md compares the tables with the field's
// reference, Docker's default profile.

// SyscallGroup is a set of system calls allowed for one reason.
type SyscallGroup struct {
	// Why is the reason a task may make these calls.
	Why string
	// Names are the calls, by their names in the kernel's tables; a name
	// the agent's architecture does not have is skipped.
	Names []string
}

// AllowedSyscalls are the calls a task may make with any arguments.
var AllowedSyscalls = []SyscallGroup{
	{"reading and writing descriptors", []string{
		"read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "preadv2",
		"pwritev", "pwritev2", "lseek", "sendfile", "splice", "tee", "vmsplice",
		"copy_file_range", "close", "close_range", "dup", "dup2", "dup3", "pipe", "pipe2",
		"flock", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
		"fadvise64", "readahead", "fallocate", "ftruncate", "truncate",
	}},
	{"opening, naming and inspecting files (the mounts, Landlock and the file modes decide what is reachable)", []string{
		"open", "openat", "openat2", "creat", "stat", "fstat", "lstat", "newfstatat", "statx",
		"fstatat", // the aarch64 table's name for newfstatat (79)
		"statfs", "fstatfs", "access", "faccessat", "faccessat2", "getcwd", "chdir", "fchdir",
		"getdents", "getdents64", "readlink", "readlinkat", "mkdir", "mkdirat", "mknod", "mknodat",
		"rmdir", "unlink", "unlinkat", "link", "linkat", "symlink", "symlinkat",
		"rename", "renameat", "renameat2", "chmod", "fchmod", "fchmodat", "fchmodat2",
		"chown", "fchown", "fchownat", "lchown", "umask", "utime", "utimes", "utimensat", "futimesat",
		"getxattr", "lgetxattr", "fgetxattr", "getxattrat", "setxattr", "lsetxattr", "fsetxattr", "setxattrat",
		"listxattr", "llistxattr", "flistxattr", "listxattrat", "removexattr", "lremovexattr",
		"fremovexattr", "removexattrat", "statmount", "listmount", "cachestat",
	}},
	{"watching files and waiting on descriptors", []string{
		"poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
		"epoll_ctl_old", "epoll_wait", "epoll_wait_old", "epoll_pwait", "epoll_pwait2",
		"eventfd", "eventfd2", "signalfd", "signalfd4", "timerfd_create", "timerfd_gettime",
		"timerfd_settime", "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
		"fanotify_mark", // useless without fanotify_init, which is refused
	}},
	{"memory of the task's own processes", []string{
		"brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync",
		"mlock", "mlock2", "mlockall", "munlock", "munlockall", "remap_file_pages",
		"memfd_create", "memfd_secret", "membarrier", "mseal", "map_shadow_stack",
		"pkey_alloc", "pkey_free", "pkey_mprotect",
	}},
	{"processes and threads without new namespaces (clone is judged by its flags, below)", []string{
		"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
		"set_tid_address", "set_robust_list", "get_robust_list", "rseq", "restart_syscall",
		"arch_prctl", "set_thread_area", "get_thread_area", "prctl", "uretprobe",
		"pidfd_open", "process_mrelease",
	}},
	{"futexes", []string{
		"futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
	}},
	{"signals (the queueing calls are judged by their target, below)", []string{
		"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
		"rt_sigtimedwait", "sigaltstack", "kill", "tkill", "tgkill", "pause",
	}},
	{"identity, limits and scheduling of the task's own processes (the kernel checks the privilege each needs, and the task has none)", []string{
		"getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
		"getresgid", "getgroups", "setuid", "setgid", "setreuid", "setregid", "setresuid",
		"setresgid", "setfsuid", "setfsgid", "setgroups", "capget", "capset",
		"getpgid", "setpgid", "getpgrp", "getsid", "setsid", "getrlimit", "setrlimit", "prlimit64",
		"getrusage", "getpriority", "setpriority", "ioprio_get", "ioprio_set", "sched_yield",
		"sched_getaffinity", "sched_setaffinity", "sched_getattr", "sched_setattr",
		"sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
		"sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval",
		"getcpu", "uname", "sysinfo", "times",
	}},
	{"clocks and timers (setting the clock needs CAP_SYS_TIME; adjtimex reads it without)", []string{
		"clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time",
		"clock_adjtime", "adjtimex", "alarm", "getitimer", "setitimer", "timer_create",
		"timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime",
	}},
	{"32-bit time variants: the aarch64 table lists them; a 64-bit kernel has no such calls", []string{
		"clock_adjtime64", "clock_getres_time64", "clock_gettime64", "clock_nanosleep_time64",
		"futex_time64", "io_pgetevents_time64", "mq_timedreceive_time64", "mq_timedsend_time64",
		"ppoll_time64", "pselect6_time64", "recvmmsg_time64", "rt_sigtimedwait_time64",
		"sched_rr_get_interval_time64", "semtimedop_time64", "timer_gettime64", "timer_settime64",
		"timerfd_gettime64", "timerfd_settime64", "utimensat_time64",
	}},
	{"sockets (socket is judged by its family, below; the network namespace decides what is reachable)", []string{
		"socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername",
		"getsockopt", "setsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg",
		"recvmmsg", "shutdown",
	}},
	{"System V and POSIX IPC, in the task's own IPC namespace and private mqueue", []string{
		"msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl",
		"shmget", "shmat", "shmdt", "shmctl", "mq_open", "mq_unlink", "mq_timedsend",
		"mq_timedreceive", "mq_notify", "mq_getsetattr",
	}},
	{"asynchronous I/O of the older kind, which seccomp sees call by call (io_uring's rings it does not, and are refused)", []string{
		"io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
	}},
	{"random numbers", []string{"getrandom"}},
	{"confining itself further", []string{
		"seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
	}},
}

// ENOSYSSyscalls are refused with ENOSYS rather than EPERM: clone3, whose
// flags lie in memory a filter cannot read, so that glibc and musl fall
// back to clone, whose flags it can.
var ENOSYSSyscalls = []string{"clone3"}

// nsFlags are the namespace flags of clone(2): CLONE_NEWNS, NEWCGROUP,
// NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET. A task has no capability in its
// user namespace, so the kernel would refuse all but CLONE_NEWUSER; the
// filter refuses them all, before the kernel's namespace code runs.
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Personalities are the personality(2) values a task may set: the Linux
// one, PER_LINUX32 (setarch's 32-bit uname), each with UNAME26, and
// 0xffffffff, which only reads the current one. Every other flag
// (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...) weakens the
// task's own memory layout, and is what exploits ask for.
var Personalities = []uint32{
	perLinux, perLinux32, uname26, perLinux32 | uname26, 0xffffffff,
}

// Values of <linux/personality.h>.
const (
	perLinux   = 0x0000
	perLinux32 = 0x0008
	uname26    = 0x0020000
)

// RefusedSocketFamilies are the socket(2) families a task may not open:
// AF_ALG, the kernel's crypto API, a source of kernel bugs no shell tool
// needs, and AF_VSOCK, which reaches the host or hypervisor past every
// network namespace.
var RefusedSocketFamilies = []uint32{unix.AF_ALG, unix.AF_VSOCK}

// RefusedIoctls are the ioctl(2) requests a task may not make: TIOCSTI,
// which pushes bytes into a terminal's input queue as if typed (a task
// holding a descriptor of another terminal, or of its own terminal once
// another program reads it, would type commands into it), and TIOCLINUX,
// which among other things copies and pastes the virtual console's
// selection (the same injection through the console). The kernel checks
// TIOCSTI for CAP_SYS_ADMIN only where legacy_tiocsti is off; the filter
// refuses both whatever the kernel's setting (docs/security.md, "The
// task's terminal").
var RefusedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX}

// argTest is one test of a system call's argument: the low or high 32
// bits of argument arg, equal to val (or, with bits, sharing a bit with
// it), negated with not.
type argTest struct {
	arg  int
	high bool
	bits bool
	not  bool
	val  uint32
}

// argClause returns ret when every test holds.
type argClause struct {
	tests []argTest
	ret   uint32
}

// argRule is a call judged by its arguments: the first clause whose tests
// all hold gives the action, else otherwise.
type argRule struct {
	name      string
	why       string
	clauses   []argClause
	otherwise uint32
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

func lowEq(arg int, v uint32) argTest { return argTest{arg: arg, val: v} }

// argumentRules are the calls allowed or refused by their arguments. Only
// the low 32 bits of an argument the kernel reads as an int are tested:
// it ignores the rest.
func argumentRules() []argRule {
	personality := argRule{name: "personality", otherwise: retEPERM,
		why: "only the values in Personalities: the others turn off address randomization or make data executable"}
	for _, p := range Personalities {
		personality.clauses = append(personality.clauses, argClause{tests: []argTest{lowEq(0, p)}, ret: retAllow})
	}
	socket := argRule{name: "socket", otherwise: retAllow, why: "every family but RefusedSocketFamilies"}
	for _, f := range RefusedSocketFamilies {
		socket.clauses = append(socket.clauses, argClause{tests: []argTest{lowEq(0, f)}, ret: retEPERM})
	}
	ioctl := argRule{name: "ioctl", otherwise: retAllow, why: "every request but RefusedIoctls"}
	for _, req := range RefusedIoctls {
		ioctl.clauses = append(ioctl.clauses, argClause{tests: []argTest{lowEq(1, req)}, ret: retEPERM})
	}
	return []argRule{
		ioctl,
		{name: "fcntl", otherwise: retAllow,
			why:     "all but F_SETSIG with a signal, which has the kernel send a file's owner (PID 1, after F_SETOWN) a signal with a code the Go runtime takes for a fault",
			clauses: []argClause{{tests: []argTest{lowEq(1, unix.F_SETSIG), {arg: 2, not: true}}, ret: retEPERM}}},
		{name: "clone", otherwise: retAllow, why: "without namespace flags (nsFlags)",
			clauses: []argClause{{tests: []argTest{{arg: 0, bits: true, val: nsFlags}}, ret: retEPERM}}},
		personality,
		socket,
		{name: "rt_sigqueueinfo", otherwise: retAllow, why: "to any process but PID 1, the shim: a queued signal carries a code of the sender's choosing",
			clauses: []argClause{{tests: []argTest{lowEq(0, 1)}, ret: retEPERM}}},
		{name: "rt_tgsigqueueinfo", otherwise: retAllow, why: "to any thread group but PID 1's, as rt_sigqueueinfo",
			clauses: []argClause{{tests: []argTest{lowEq(0, 1)}, ret: retEPERM}}},
		{name: "pidfd_send_signal", otherwise: retAllow, why: "without a siginfo (kill's code), since a pidfd of PID 1 is one pidfd_open away",
			clauses: []argClause{
				{tests: []argTest{{arg: 2, not: true}}, ret: retEPERM},
				{tests: []argTest{{arg: 2, high: true, not: true}}, ret: retEPERM},
			}},
	}
}

// struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer;
// __u64 args[6].
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argOffset is the offset of the low or high half of argument arg.
func argOffset(arg int, high bool) uint32 {
	off := uint32(offArgs + 8*arg)
	if high == !bigEndian {
		off += 4
	}
	return off
}

// bigEndian is true on a big-endian machine, where an argument's high half
// comes first.
var bigEndian = binary.NativeEndian.Uint16([]byte{0, 1}) == 1

// emit returns the instructions of r: its clauses in order, then its
// otherwise action.
func (r argRule) emit() []bpf.Instruction {
	var out []bpf.Instruction
	for _, c := range r.clauses {
		n := len(c.tests)
		for i, t := range c.tests {
			rest := uint8(2*n - 2*i - 1) // instructions after this test's jump up to the clause's next one
			cond := bpf.JumpEqual
			if t.bits {
				cond = bpf.JumpBitsSet
			}
			j := bpf.JumpIf{Cond: cond, Val: t.val, SkipFalse: rest}
			if t.not {
				j.SkipTrue, j.SkipFalse = rest, 0
			}
			out = append(out, bpf.LoadAbsolute{Off: argOffset(t.arg, t.high), Size: 4}, j)
		}
		out = append(out, bpf.RetConstant{Val: c.ret})
	}
	return append(out, bpf.RetConstant{Val: r.otherwise})
}

// span is a range of system-call numbers [lo, next span's lo) with one
// leaf: a constant action, or an argument rule.
type span struct {
	lo   uint32
	ret  uint32
	rule *argRule
}

func (s span) sameLeaf(o span) bool { return s.rule == nil && o.rule == nil && s.ret == o.ret }

// SyscallActions returns the filter's action for each system call the
// architecture's table names, by name: allowed, refused with EPERM or
// ENOSYS, or "arguments" for a call judged by its arguments. Names of the
// tables the architecture lacks are left out. For tests and the
// comparison in docs/security.md.
func SyscallActions(a *arch.Info) (map[string]string, error) {
	acts, rules, err := actions(a)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(a.SyscallNames))
	for name, nr := range a.SyscallNames {
		switch {
		case rules[uint32(nr)] != nil:
			out[name] = "arguments"
		case acts[uint32(nr)] == retAllow:
			out[name] = "allow"
		case acts[uint32(nr)] == retENOSYS:
			out[name] = "ENOSYS"
		default:
			out[name] = "EPERM"
		}
	}
	return out, nil
}

// actions maps each number of a's table to its constant action, or to
// its argument rule.
func actions(a *arch.Info) (map[uint32]uint32, map[uint32]*argRule, error) {
	acts := make(map[uint32]uint32, len(a.SyscallNumbers))
	for nr := range a.SyscallNumbers {
		acts[uint32(nr)] = retEPERM
	}
	seen := map[string]string{}
	claim := func(name, by string) (uint32, bool, error) {
		if prev, dup := seen[name]; dup {
			return 0, false, fmt.Errorf("system call %s is in the filter's tables twice (%s, %s)", name, prev, by)
		}
		seen[name] = by
		nr, ok := a.SyscallNames[name]
		return uint32(nr), ok, nil
	}
	for _, g := range AllowedSyscalls {
		for _, name := range g.Names {
			nr, ok, err := claim(name, g.Why)
			if err != nil {
				return nil, nil, err
			}
			if ok {
				acts[nr] = retAllow
			}
		}
	}
	for _, name := range ENOSYSSyscalls {
		nr, ok, err := claim(name, "ENOSYS")
		if err != nil {
			return nil, nil, err
		}
		if ok {
			acts[nr] = retENOSYS
		}
	}
	rules := map[uint32]*argRule{}
	for _, r := range argumentRules() {
		nr, ok, err := claim(r.name, r.why)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			rules[nr] = &r
		}
	}
	return acts, rules, nil
}

// Assemble assembles the filter for the agent's architecture, as the
// kernel's struct sock_filter array that seccomp(2) loads; the agent does
// it once and hands the result to each task's shim in its Config (see
// shim.EncodeFilter), so that no shim builds the system-call tables
// again. It returns an error when the architecture has no table here or
// the program does not assemble. The
// first check refuses, with ENOSYS, every system call made through another
// architecture's entry (the 32-bit int 0x80 on x86-64, AArch32 on arm64),
// whose numbers mean other calls. Then a binary search over the call
// number: x32 calls on x86-64 (the number with bit 30 set) lie above every
// number of the table and get ENOSYS with the rest of that range. The
// calls allowed whatever their arguments cost nothing after the first:
// the kernel (from 5.11) finds the filter's constant answers for them when
// it is loaded and skips the filter for those.
func Assemble() ([]unix.SockFilter, error) {
	insts, err := seccompProgram()
	if err != nil {
		return nil, err
	}
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

// seccompProgram returns the filter's instructions for the agent's
// architecture.
func seccompProgram() ([]bpf.Instruction, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("the seccomp policy's architecture: %w", err)
	}
	return programFor(native)
}

func programFor(a *arch.Info) ([]bpf.Instruction, error) {
	acts, rules, err := actions(a)
	if err != nil {
		return nil, err
	}
	nrs := make([]uint32, 0, len(acts))
	for nr := range acts {
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	// Numbers absent from the table, between and above its entries, get
	// ENOSYS.
	var spans []span
	add := func(s span) {
		if n := len(spans); n > 0 && spans[n-1].sameLeaf(s) {
			return
		}
		spans = append(spans, s)
	}
	next := uint32(0)
	for _, nr := range nrs {
		if nr > next {
			add(span{lo: next, ret: retENOSYS})
		}
		add(span{lo: nr, ret: acts[nr], rule: rules[nr]})
		next = nr + 1
	}
	add(span{lo: next, ret: retENOSYS})
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(a.ID), SkipTrue: 1},
		bpf.RetConstant{Val: retENOSYS},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	return append(prog, search(spans)...), nil
}

// search returns a binary search over spans, which cover every number
// from spans[0].lo on, with the accumulator holding the call's number.
func search(spans []span) []bpf.Instruction {
	if len(spans) == 1 {
		if r := spans[0].rule; r != nil {
			return r.emit()
		}
		return []bpf.Instruction{bpf.RetConstant{Val: spans[0].ret}}
	}
	mid := len(spans) / 2
	left, right := search(spans[:mid]), search(spans[mid:])
	split := spans[mid].lo
	var out []bpf.Instruction
	if len(left) <= 255 {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: split, SkipTrue: uint8(len(left))})
	} else {
		// A conditional jump reaches 255 instructions at most.
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: split, SkipFalse: 1}, bpf.Jump{Skip: uint32(len(left))})
	}
	out = append(out, left...)
	return append(out, right...)
}

// Supported reports whether the kernel offers seccomp filters
// (CONFIG_SECCOMP_FILTER).
func Supported() bool { return seccompbpf.Supported() }
