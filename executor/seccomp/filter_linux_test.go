//go:build linux

package seccomp

import (
	"bufio"
	"encoding/binary"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// allowedBeyondReference are the calls the reference refuses to an
// unprivileged container that the tenant level allows, each with its
// reason. None today: a call added here is also a row of the comparison
// in docs/security.md.
var allowedBeyondReference = map[string]string{}

// refusedBeyondReference are the calls the reference allows that the
// tenant level refuses, with the reason (docs/security.md lists them).
var refusedBeyondReference = map[string]string{
	"ptrace":            "the reference allows it on kernels from 4.8; a task has no process of another tenant in its PID namespace to trace, and tracing its own is a debugger's need, not a shell's",
	"process_vm_readv":  "as ptrace: another process's memory",
	"process_vm_writev": "as ptrace: another process's memory",
	"name_to_handle_at": "its only use is open_by_handle_at, refused by both, which opens a file by handle past the mount tree",
	"modify_ldt":        "a local descriptor table serves 16-bit code (Wine, DOSEMU) and has been a source of kernel bugs",
}

// referenceRefused reads the reference's refused calls from testdata.
func referenceRefused(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open("testdata/seccomp-reference-refused.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			out[line] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// filterVM is the filter of the agent's architecture in x/net/bpf's
// virtual machine.
type filterVM struct {
	t    *testing.T
	vm   *bpf.VM
	arch *arch.Info
}

func newFilterVM(t *testing.T) filterVM {
	t.Helper()
	native, err := arch.GetInfo("")
	if err != nil {
		t.Skipf("no system-call table for this architecture: %v", err)
	}
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) > unix.BPF_MAXINSNS {
		t.Fatalf("the filter has %d instructions, the kernel takes %d", len(prog), unix.BPF_MAXINSNS)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	return filterVM{t: t, vm: vm, arch: native}
}

// run returns the filter's action for call nr of architecture auditArch
// with args.
func (f filterVM) run(auditArch uint32, nr uint32, args ...uint64) uint32 {
	f.t.Helper()
	// struct seccomp_data in the machine's order; the virtual machine
	// loads words in network order, so each 32-bit word goes in big-endian
	// where the kernel would have it.
	data := make([]byte, 64)
	put := func(off uint32, v uint32) { binary.BigEndian.PutUint32(data[off:], v) }
	put(offNr, nr)
	put(offArch, auditArch)
	for i, a := range args {
		put(argOffset(i, false), uint32(a))
		put(argOffset(i, true), uint32(a>>32))
	}
	ret, err := f.vm.Run(data)
	if err != nil {
		f.t.Fatal(err)
	}
	return uint32(ret)
}

func (f filterVM) call(name string, args ...uint64) uint32 {
	f.t.Helper()
	nr, ok := f.arch.SyscallNames[name]
	if !ok {
		f.t.Fatalf("no %s on %s", name, f.arch.Name)
	}
	return f.run(uint32(f.arch.ID), uint32(nr), args...)
}

func verdict(ret uint32) string {
	switch ret {
	case retAllow:
		return "allow"
	case retEPERM:
		return "EPERM"
	case retENOSYS:
		return "ENOSYS"
	}
	return "other"
}

// Every call of the architecture's table, run through the assembled
// filter: what the reference refuses, the filter refuses, unless
// allowedBeyondReference says why not; what the filter refuses beyond the
// reference is in refusedBeyondReference.
func TestSeccompAtLeastAsStrictAsReference(t *testing.T) {
	f := newFilterVM(t)
	ref := referenceRefused(t)
	acts, err := SyscallActions(f.arch)
	if err != nil {
		t.Fatal(err)
	}
	// The calls the reference judges by their arguments: the second test's.
	referenceArgs := map[string]bool{"clone": true, "personality": true, "socket": true}
	refusedSeen := 0
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range f.arch.SyscallNames {
			if !yield(n) {
				return
			}
		}
	}) {
		got := verdict(f.call(name))
		if a := acts[name]; a != got && a != "arguments" {
			t.Errorf("%s: the filter answers %s, SyscallActions says %s", name, got, a)
		}
		switch {
		case ref[name] && got == "allow":
			if allowedBeyondReference[name] == "" {
				t.Errorf("%s: refused by the reference, allowed by the filter with no reason in allowedBeyondReference", name)
			}
		case ref[name]:
			refusedSeen++
			if allowedBeyondReference[name] != "" {
				t.Errorf("%s: refused now; remove it from allowedBeyondReference", name)
			}
		case !referenceArgs[name] && got != "allow" && refusedBeyondReference[name] == "":
			t.Errorf("%s: allowed by the reference, refused (%s) with no reason in refusedBeyondReference", name, got)
		case got == "allow" && refusedBeyondReference[name] != "":
			t.Errorf("%s: allowed now; remove it from refusedBeyondReference", name)
		}
	}
	if refusedSeen < 50 {
		t.Errorf("only %d of the reference's refused calls are in %s's table: the data file is not read", refusedSeen, f.arch.Name)
	}
	// The ESCAPES classes by name: io_uring (E8), the mount API and
	// namespaces (E9), exploit primitives (E11), keyrings (E12), the
	// kernel log (E13).
	for _, name := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register",
		"unshare", "setns", "mount", "open_tree", "move_mount", "fsopen",
		"userfaultfd", "perf_event_open", "bpf", "keyctl", "add_key", "request_key", "syslog",
		"ptrace", "pidfd_getfd", "process_vm_readv", "kcmp"} {
		if got := verdict(f.call(name)); got == "allow" {
			t.Errorf("%s allowed", name)
		}
	}
	if got := verdict(f.call("clone3")); got != "ENOSYS" {
		t.Errorf("clone3: %s, want ENOSYS so that C libraries fall back to clone", got)
	}
	// What the shim and the Go runtime need once the filter is on.
	for _, name := range []string{"read", "write", "wait4", "kill", "tgkill", "futex", "mmap", "munmap",
		"madvise", "rt_sigreturn", "rt_sigaction", "rt_sigprocmask", "sigaltstack", "sched_yield",
		"nanosleep", "epoll_pwait", "epoll_ctl", "execve", "exit_group", "getpid", "gettid", "pidfd_open",
		"waitid", "close_range", "dup3", "openat", "pipe2", "fcntl", "clone"} {
		if got := verdict(f.call(name)); got != "allow" {
			t.Errorf("%s: %s, needed by the shim or the Go runtime", name, got)
		}
	}
}

// Calls from outside the table: another architecture's entry, x32 on
// x86-64, numbers the table does not know.
func TestSeccompOtherEntries(t *testing.T) {
	f := newFilterVM(t)
	unshare := uint32(f.arch.SyscallNames["unshare"])
	if got := verdict(f.run(uint32(arch.I386.ID), 310, unix.CLONE_NEWUSER)); got != "ENOSYS" {
		t.Errorf("unshare through the i386 entry: %s, want ENOSYS", got)
	}
	if got := verdict(f.run(uint32(arch.ARM.ID), unshare)); got != "ENOSYS" {
		t.Errorf("AArch32 entry: %s, want ENOSYS", got)
	}
	highest := 0
	for nr := range f.arch.SyscallNumbers {
		highest = max(highest, nr)
	}
	for _, nr := range []uint32{uint32(highest) + 1, 1000, 0x3fffffff, 0xffffffff} {
		if got := verdict(f.run(uint32(f.arch.ID), nr)); got != "ENOSYS" {
			t.Errorf("number %#x, unknown to the table: %s, want ENOSYS", nr, got)
		}
	}
	if f.arch.ID == arch.X86_64.ID {
		// x32 shares x86-64's audit arch; its numbers have bit 30 set.
		for name, nr := range arch.X32.SyscallNames {
			if got := verdict(f.run(uint32(f.arch.ID), uint32(nr)|0x40000000)); got == "allow" {
				t.Errorf("x32 %s allowed", name)
			}
		}
	}
}

// The argument filters, against the reference's: each row is a call with
// arguments, what the reference does with it, and what the filter does.
// Where they differ the row says why.
func TestSeccompArgumentFilters(t *testing.T) {
	f := newFilterVM(t)
	const (
		allow = "allow"
		eperm = "EPERM"
	)
	type row struct {
		name      string
		args      []uint64
		reference string // what the reference does
		want      string // what the filter does
		why       string // when they differ
	}
	rows := []row{
		// personality: the reference allows these five values only.
		{"personality", []uint64{0}, allow, allow, ""},
		{"personality", []uint64{perLinux32}, allow, allow, ""},
		{"personality", []uint64{uname26}, allow, allow, ""},
		{"personality", []uint64{perLinux32 | uname26}, allow, allow, ""},
		{"personality", []uint64{0xffffffff}, allow, allow, ""},
		{"personality", []uint64{0x0040000}, eperm, eperm, ""}, // ADDR_NO_RANDOMIZE
		{"personality", []uint64{0x0400000}, eperm, eperm, ""}, // READ_IMPLIES_EXEC
		{"personality", []uint64{0x0100000}, eperm, eperm, ""}, // MMAP_PAGE_ZERO
		{"personality", []uint64{0x0040008}, eperm, eperm, ""},
		{"personality", []uint64{1 << 32}, eperm, allow, "the kernel reads an unsigned int: this is personality(0)"},
		// clone: the reference refuses any namespace flag.
		{"clone", []uint64{uint64(unix.SIGCHLD) | unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID}, allow, allow, ""},                                     // glibc's fork
		{"clone", []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD}, allow, allow, ""}, // a thread
		{"clone", []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, allow, allow, ""},                                     // Go's os.StartProcess
		{"clone", []uint64{unix.CLONE_NEWNS}, eperm, eperm, ""},
		{"clone", []uint64{unix.CLONE_NEWCGROUP}, eperm, eperm, ""},
		{"clone", []uint64{unix.CLONE_NEWUTS}, eperm, eperm, ""},
		{"clone", []uint64{unix.CLONE_NEWIPC}, eperm, eperm, ""},
		{"clone", []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm, eperm, ""},
		{"clone", []uint64{unix.CLONE_NEWPID}, eperm, eperm, ""},
		{"clone", []uint64{unix.CLONE_NEWNET}, eperm, eperm, ""},
		// socket: the reference refuses AF_ALG and AF_VSOCK.
		{"socket", []uint64{unix.AF_UNIX}, allow, allow, ""},
		{"socket", []uint64{unix.AF_INET}, allow, allow, ""},
		{"socket", []uint64{unix.AF_INET6}, allow, allow, ""},
		{"socket", []uint64{unix.AF_NETLINK}, allow, allow, ""},
		{"socket", []uint64{unix.AF_NFC}, allow, allow, ""},
		{"socket", []uint64{unix.AF_KCM}, allow, allow, ""},
		{"socket", []uint64{unix.AF_ALG}, eperm, eperm, ""},
		{"socket", []uint64{unix.AF_VSOCK}, eperm, eperm, ""},
		// The tenant level's own argument filters, which the reference
		// does not have: signals to PID 1 with a code of the sender's
		// choosing.
		{"fcntl", []uint64{0, unix.F_GETFL}, allow, allow, ""},
		{"fcntl", []uint64{0, unix.F_SETSIG, 0}, allow, allow, ""},
		{"fcntl", []uint64{0, unix.F_SETSIG, uint64(unix.SIGSEGV)}, allow, eperm, "the kernel would send the file's owner, PID 1, a signal with a kernel code"},
		{"rt_sigqueueinfo", []uint64{1, uint64(unix.SIGSEGV), 0x1000}, allow, eperm, "PID 1 is the shim"},
		{"rt_sigqueueinfo", []uint64{7, uint64(unix.SIGUSR1), 0x1000}, allow, allow, ""},
		{"rt_tgsigqueueinfo", []uint64{1, 1, uint64(unix.SIGSEGV), 0x1000}, allow, eperm, "PID 1 is the shim"},
		{"rt_tgsigqueueinfo", []uint64{7, 7, uint64(unix.SIGUSR1), 0x1000}, allow, allow, ""},
		{"pidfd_send_signal", []uint64{3, uint64(unix.SIGTERM), 0, 0}, allow, allow, ""},
		// ioctl: no input pushed into a terminal.
		{"ioctl", []uint64{0, unix.TCGETS}, allow, allow, ""},
		{"ioctl", []uint64{0, unix.TIOCSWINSZ}, allow, allow, ""},
		{"ioctl", []uint64{0, unix.TIOCSCTTY}, allow, allow, ""},
		{"ioctl", []uint64{0, unix.TIOCSTI}, allow, eperm, "pushes input into a terminal as if typed"},
		{"ioctl", []uint64{0, unix.TIOCLINUX}, allow, eperm, "the console's selection pasted as input"},
		{"ioctl", []uint64{0, 1<<32 | unix.TIOCSTI}, allow, eperm, "the kernel reads an unsigned int: this is TIOCSTI"},
		{"pidfd_send_signal", []uint64{3, uint64(unix.SIGSEGV), 0x1000, 0}, allow, eperm, "a siginfo of the sender's choosing, and the pidfd may be PID 1's"},
		{"pidfd_send_signal", []uint64{3, uint64(unix.SIGSEGV), 0x7f00_0000_0000, 0}, allow, eperm, "as above, a pointer above 4 GiB"},
	}
	for _, r := range rows {
		got := verdict(f.call(r.name, r.args...))
		if got != r.want {
			t.Errorf("%s%#x: %s, want %s", r.name, r.args, got, r.want)
		}
		if r.reference == eperm && got == allow && r.why == "" {
			t.Errorf("%s%#x: refused by the reference, allowed with no reason", r.name, r.args)
		}
		if r.reference != r.want && r.why == "" {
			t.Errorf("%s%#x: differs from the reference without a reason", r.name, r.args)
		}
	}
}

// Every name in the filter's tables is a call of some architecture's
// table: a misspelt name would be skipped without a word.
func TestSeccompTableNames(t *testing.T) {
	known := func(name string) bool {
		for _, a := range []*arch.Info{arch.X86_64, arch.AARCH64, arch.ARM, arch.I386} {
			if _, ok := a.SyscallNames[name]; ok {
				return true
			}
		}
		return false
	}
	var names []string
	for _, g := range AllowedSyscalls {
		names = append(names, g.Names...)
	}
	names = append(names, ENOSYSSyscalls...)
	for _, r := range argumentRules() {
		names = append(names, r.name)
	}
	for _, n := range names {
		if !known(n) {
			t.Errorf("%s is no system call of any table", n)
		}
	}
	for _, a := range []*arch.Info{arch.X86_64, arch.AARCH64} {
		if _, err := programFor(a); err != nil {
			t.Errorf("%s: %v", a.Name, err)
		}
	}
}
