//go:build linux

package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Root inside (RootConfig.RootInside; docs/images.md, "Root inside"):
// the shim, root in the node's user namespace, forks the shell's first
// process with CLONE_NEWUSER and maps of 0 to the task's UID and GID
// alone (setgroups denied); the child sets its IDs to 0 there, which the
// kernel holds as the task's UID and GID, and executes the shim's own
// binary (/proc/self/exe) as ExecArg0. That second stage, the only
// process of the namespace, drops every capability (the bounding set
// included: a new user namespace starts with all of them), joins a
// session keyring of its own, applies the Landlock ruleset the shim made
// in the image's root (passed as descriptor insideLandlockFD) and the
// seccomp filter, and executes the shell. A multithreaded process such as
// the shim cannot unshare(2) a user namespace, so the namespace is made
// at the fork, and the steps that must follow it run in the second stage.
//
// The namespace is made by root in the node's namespace, so its owner is
// root: no process of the task's UID outside it has any capability in
// it. Every other namespace of the task (mount, PID, IPC, UTS, network)
// was made by the shim before and is owned by the node's user namespace,
// so the task's uid 0 cannot mount, change the network or the host name,
// even with a capability; it has none.

// insideLandlockFD is the descriptor of the Landlock ruleset in the
// second stage.
const insideLandlockFD = 3

// AptSandboxConf is the path, in a root-inside task's image that has
// /etc/apt/apt.conf.d, of the APT configuration the shim writes (when
// absent) so that apt runs its downloads as root inside: its sandbox
// user, _apt, is not mapped in the task's user namespace.
const AptSandboxConf = "/etc/apt/apt.conf.d/00bashtask-sandbox-user"

// aptSandboxConfData is AptSandboxConf's content.
const aptSandboxConfData = "// Written by bashtask for a task that is root inside: _apt is not mapped in its user namespace.\nAPT::Sandbox::User \"root\";\n"

// rootInside reports whether the task is root inside its user namespace.
func (st *state) rootInside() bool {
	return st.cfg.Root != nil && st.cfg.Root.RootInside
}

// checkRootInside checks what RootInside requires of the Config.
func (st *state) checkRootInside() error {
	if !st.rootInside() {
		return nil
	}
	switch {
	case !st.cfg.Root.IDMapped:
		return errors.New("root inside needs the layers idmapped (root.idMapped)")
	case st.cfg.UID == nil || st.cfg.GID == nil:
		return errors.New("root inside needs the task's UID and GID")
	}
	return nil
}

// writeAptSandboxConf writes AptSandboxConf, owned by the task (root
// inside), when the image has /etc/apt/apt.conf.d and the file is not
// there yet (a workspace's upper directory keeps it).
func writeAptSandboxConf(st *state) error {
	if fi, err := os.Lstat("/etc/apt/apt.conf.d"); err != nil || !fi.IsDir() {
		return nil
	}
	f, err := os.OpenFile(AptSandboxConf, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", AptSandboxConf, err)
	}
	_, err = f.WriteString(aptSandboxConfData)
	if err == nil {
		err = f.Chown(int(*st.cfg.UID), int(*st.cfg.GID))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", AptSandboxConf, err)
	}
	return nil
}

// insideLaunch turns the shell's start into the second stage's: argv,
// the ruleset's and the seccomp filter's descriptors among files, and the
// user namespace's clone flag, maps and IDs in sys. It returns an error
// when the filter's memfd cannot be made.
func insideLaunch(st *state, argv []string, files []*os.File, sys *syscall.SysProcAttr) (string, []string, []*os.File, error) {
	uid, gid := int(*st.cfg.UID), int(*st.cfg.GID)
	sys.Cloneflags |= unix.CLONE_NEWUSER
	sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
	sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}}
	sys.GidMappingsEnableSetgroups = false
	sys.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	landlock := "-"
	if st.landlock.fd >= 0 {
		landlock = strconv.FormatUint(uint64(st.landlock.flags), 10)
		files = append(files, os.NewFile(uintptr(st.landlock.fd), "landlock"))
	}
	seccomp := "-"
	if st.seccomp != nil {
		// The second stage cannot read the Config: the filter goes to it
		// in a memfd, read and closed before the shell starts.
		fd, err := filterMemfd(st.cfg.SeccompFilter)
		if err != nil {
			return "", nil, nil, err
		}
		st.insideFilter = os.NewFile(uintptr(fd), "seccomp")
		seccomp = strconv.Itoa(len(files))
		files = append(files, st.insideFilter)
	}
	return "/proc/self/exe", append([]string{ExecArg0, seccomp, landlock}, argv...), files, nil
}

// filterMemfd returns a close-on-exec memfd holding filter. It asks for a
// memfd that can never be made executable (MFD_NOEXEC_SEAL, Linux 6.3),
// which a kernel with vm.memfd_noexec=2 requires, and makes a plain one
// where the kernel does not know the flag (EINVAL).
func filterMemfd(filter []byte) (int, error) {
	fd, err := unix.MemfdCreate("bashtask-seccomp", unix.MFD_CLOEXEC|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("bashtask-seccomp", unix.MFD_CLOEXEC)
	}
	if err != nil {
		return -1, fmt.Errorf("a memfd for the seccomp filter: %w", err)
	}
	n, err := unix.Pwrite(fd, filter, 0)
	switch {
	case err != nil:
		unix.Close(fd)
		return -1, fmt.Errorf("writing the seccomp filter's memfd: %w", err)
	case n != len(filter):
		unix.Close(fd)
		return -1, fmt.Errorf("writing the seccomp filter's memfd: wrote %d of %d bytes", n, len(filter))
	}
	return fd, nil
}

// readFilter reads and closes the second stage's seccomp filter from the
// memfd whose descriptor arg names.
func readFilter(arg string) ([]unix.SockFilter, error) {
	fd, err := strconv.Atoi(arg)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("the seccomp filter's descriptor %q: not a descriptor past the streams", arg)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("the seccomp filter's memfd: %w", err)
	}
	if st.Size > maxFilterInsns*sockFilterSize {
		return nil, fmt.Errorf("the seccomp filter's memfd holds %d bytes, more than %d (BPF_MAXINSNS instructions of %d bytes)", st.Size, maxFilterInsns*sockFilterSize, sockFilterSize)
	}
	b := make([]byte, st.Size)
	n, err := unix.Pread(fd, b, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading the seccomp filter's memfd: %w", err)
	case n != len(b):
		return nil, fmt.Errorf("reading the seccomp filter's memfd: %d of %d bytes", n, len(b))
	}
	return decodeFilter(b)
}

// landlockRuleset is a Landlock ruleset made by the landlock step and
// applied by the second stage of a root-inside task.
type landlockRuleset struct {
	fd    int // -1 for none
	flags uint32
}

// execInside is the second stage (ExecArg0): args are the seccomp filter's
// descriptor ("-" for no filter), the Landlock flags ("-" for no ruleset), then the shell's
// argv. It returns only on a failure, with 127.
func execInside(args []string) int {
	runtime.LockOSThread()
	err := insideSteps(args) // returns only on a failure: the shell replaced it otherwise
	fmt.Fprintf(os.Stderr, "bashtask: starting the task as root inside its user namespace: %v\n", err)
	return 127
}

// insideSteps does the second stage's steps and executes the shell; it
// returns only the error that stopped it.
func insideSteps(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("want the seccomp filter's descriptor, the Landlock flags and the shell's argv, got %d arguments", len(args))
	}
	// Read first: with no Landlock ruleset the filter's descriptor may be
	// insideLandlockFD's number.
	var filter []unix.SockFilter
	if args[0] != "-" {
		var err error
		if filter, err = readFilter(args[0]); err != nil {
			return err
		}
	}
	if err := dropCapabilities(); err != nil {
		return err
	}
	if _, _, e := unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); e != 0 {
		return fmt.Errorf("joining a new session keyring: %w", e)
	}
	if args[1] != "-" {
		flags, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return fmt.Errorf("landlock flags %q: %w", args[1], err)
		}
		if err := llsyscall.LandlockRestrictSelf(insideLandlockFD, uint32(flags)); err != nil {
			return fmt.Errorf("landlock_restrict_self: %w", err)
		}
		unix.Close(insideLandlockFD)
	}
	if filter != nil {
		if err := loadFilter(filter); err != nil {
			return err
		}
	}
	argv := args[2:]
	return fmt.Errorf("executing %s: %w", argv[0], unix.Exec(argv[0], argv, os.Environ()))
}

// dropCapabilities empties this thread's bounding, inheritable and
// ambient sets, so that the shell, uid 0 of its namespace, gets no
// capability at its exec (and keeps no_new_privs, inherited).
func dropCapabilities() error {
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 && e != unix.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clearing the ambient capabilities: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}
