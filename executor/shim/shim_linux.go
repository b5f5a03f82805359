//go:build linux

package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// step is one named stage of the shim; the steps run in the order of
// [steps] and the first error ends the shim before the shell exists.
type step struct {
	name string
	run  func(*state) error
}

// state is what the steps share.
type state struct {
	cfg       Config
	report    *os.File
	wdTree    int               // detached clone of the working directory (open_tree), -1 once attached
	netns     int               // the workspace's network namespace (Config.NetNS), -1 once joined
	userns    int               // the layers' idmap (RootConfig.IDMapped), -1 for none
	ws        wsState           // a workspace task's (Config.Workspace)
	seccomp   []unix.SockFilter // the filter of the Config; nil for none
	nodeUsers nodeUserFiles     // the node's passwd and group, read before the Config arrives
	fence     fence             // a fenced task's (Config.LeaseMillis)
	shell     string            // the shell's path, set by the shell step
	files     int               // the task's files tmpfs (taskFiles), -1 until made
	tty       int               // the terminal's slave (Config.Terminal), -1 for none
	landlock  landlockRuleset   // a root-inside task's ruleset, for the second stage (RootConfig.RootInside)
	// closeAfterStart are descriptors closed once the shell started:
	// closing a detached mount (the user step's tmpfs) unmounts it and
	// waits for an RCU grace period, a fifth of a millisecond that need
	// not delay the start.
	closeAfterStart []int
	// insideFilter is the memfd of the seccomp filter for a root-inside
	// task's second stage, closed once the shell started; nil otherwise.
	insideFilter *os.File
}

// steps is the fixed order of the tenant level: mounts, then the
// identity, then Landlock, then seccomp last, so that no step after the
// filter needs a system call it denies.
var steps = []step{
	{"netns", netnsStep},
	{"mounts", mountStep},
	{StepShell, shellStep},
	{"user", userStep},
	{"hostname", hostnameStep},
	{"loopback", loopbackStep},
	{"limits", limitsStep},
	{"identity", identityStep},
	{"terminal", terminalStep},
	{"workdir", workdirStep},
	{"keyring", keyringStep},
	{"no_new_privs", noNewPrivsStep},
	{"landlock", landlockStep},
	{"seccomp", seccompStep},
}

func run() int {
	// The identity, no_new_privs, the Landlock domain and the seccomp
	// filter are attributes of a thread, inherited by what it forks. The
	// steps apply them to this thread alone, the one the shell is forked
	// from: the main goroutine, which package initialization runs on the
	// process's first thread and which stays locked to it, so the
	// process's credentials as signals and /proc see them (those of its
	// first thread) are the task's too. Applying them to every thread
	// instead (setresuid(2) through the Go runtime, Landlock and seccomp
	// with thread synchronization) costs the start about a millisecond,
	// and the shim's other threads run nothing but the Go runtime and its
	// signal delivery.
	runtime.LockOSThread()
	report := os.NewFile(ReportFD, "report")
	fail := func(name string, err error) int {
		fmt.Fprintf(report, "error %s: %v\n", name, err)
		return 127
	}
	st := &state{report: report, wdTree: -1, netns: -1, userns: -1, files: -1, tty: -1, landlock: landlockRuleset{fd: -1}, ws: wsState{tree: -1, root: -1, carry: -1}}
	// Before the Config arrives, what costs time and does not depend on
	// the task, so that it is done while the shim waits started ahead of
	// its task. Signals first: PID 1 of a namespace drops a signal it has
	// no handler for, and a stop must not be lost.
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, caughtSignals...)
	if err := detachMounts(os.Args[1:]); err != nil {
		return fail("mounts", err)
	}
	// The first decoding or encoding of a type builds encoding/json's
	// cache of its fields: the Config's, and the bodies of a workspace
	// task's reports (a tenth of a millisecond on the start's path and on
	// the exit's otherwise).
	_ = json.Unmarshal([]byte("{}"), &Config{})
	_, _ = json.Marshal(StartDir{})
	_, _ = json.Marshal(ParseCarry([]byte("dir=/\x00end\x00"), false))
	// A workspace task's rc files, both kinds: made on the start's path,
	// the first run of their code was a twentieth of a millisecond.
	st.ws.rc = [2][]byte{CarryRC(false), CarryRC(true)}
	st.nodeUsers = readNodeUserFiles()
	if _, err := io.WriteString(report, ReadyLine); err != nil {
		return 127 // nobody reads the reports: the parent is gone
	}
	data, fds, err := readConfig(ConfigFD)
	if err == nil {
		err = json.Unmarshal(data, &st.cfg)
	}
	if err != nil || st.cfg.Terminal == nil {
		// A terminal's master goes back on it (terminalStep).
		unix.Close(ConfigFD)
	}
	if err == nil && st.cfg.WorkTree {
		err = st.takeDescriptors(fds)
		fds = nil
	}
	if err == nil && st.cfg.NetNS && !st.cfg.WorkTree {
		err = errors.New("a network namespace without a work tree")
	}
	if err == nil {
		err = st.checkRootInside()
	}
	if err == nil && len(st.cfg.SeccompFilter) > 0 {
		st.seccomp, err = decodeFilter(st.cfg.SeccompFilter)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		return fail("config", err)
	}
	for _, s := range steps {
		if st.fence.fenced.Load() {
			return fail(s.name, errors.New("fenced: the node's lease on its workspaces expired before the shell started"))
		}
		if err := s.run(st); err != nil {
			return fail(s.name, err)
		}
	}
	code, err := superviseShell(st, sigs)
	if err != nil {
		return fail("start shell", err)
	}
	return code
}

// roAttr makes a mount read-only, nosuid and nodev.
var roAttr = &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}

// takeDescriptors takes the descriptors that came with the Config, in
// their order: the working directory's tree, the network namespace
// (Config.NetNS), the layers' user namespace (RootConfig.IDMapped), the
// lease pipe (Config.LeaseMillis). It closes them all on an error.
func (st *state) takeDescriptors(fds []int) error {
	want := 1
	if st.cfg.NetNS {
		want++
	}
	idmapped := st.cfg.Root != nil && st.cfg.Root.IDMapped
	if idmapped {
		want++
	}
	if st.cfg.LeaseMillis > 0 {
		want++
	}
	if len(fds) != want {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Errorf("the Config came with %d descriptors, want %d (the working directory's tree, then a network namespace, then the layers' user namespace, then the lease pipe)", len(fds), want)
	}
	st.wdTree, fds = fds[0], fds[1:]
	if st.cfg.NetNS {
		st.netns, fds = fds[0], fds[1:]
	}
	if idmapped {
		st.userns, fds = fds[0], fds[1:]
	}
	if st.cfg.LeaseMillis > 0 {
		return st.fence.watch(fds[0], time.Duration(st.cfg.LeaseMillis)*time.Millisecond)
	}
	return nil
}

// mountStep makes every mount private, remounts the whole tree read-only,
// nosuid and nodev, puts a fresh proc (hidepid=invisible) on /proc, the
// task's own /dev (the node's usual device files, the only mounts without
// nodev) and /run (Config.RunPaths bound back) and size-capped tmpfs on
// /tmp (a workspace task's /tmp is its workspace's, see workspaceTmp) and
// /dev/shm, and puts back a writable bind of the working directory at its
// path (inside the new /tmp if it lies there). With Config.Root it moves
// into the image's root once the node's paths it keeps are cloned
// (enterRoot), and does the rest there.
func mountStep(st *state) error {
	wd := st.cfg.WorkDir
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if rc := st.cfg.ResolvConf; rc != "" {
		// Before the private /tmp hides its source, and before the tree
		// turns read-only, which then covers this bind too.
		if err := unix.Mount(rc, "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s over /etc/resolv.conf: %w", rc, err)
		}
	}
	// A clone of the working directory taken before anything is mounted
	// over its path (a working directory under /tmp would be hidden by the
	// private /tmp) and before the tree turns read-only: the parent's
	// (Config.WorkTree), or one of this namespace's.
	tree := st.wdTree
	if tree < 0 {
		var err error
		tree, err = unix.OpenTree(unix.AT_FDCWD, wd, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("cloning working directory %s: %w", wd, err)
		}
	}
	st.wdTree = -1
	defer func() {
		if tree >= 0 {
			unix.Close(tree)
		}
	}()
	var clones nodeClones
	defer clones.close()
	if err := cloneDevices(&clones); err != nil {
		return err
	}
	// The node's root turns read-only; a task in an image leaves it
	// (its upper directory may lie on it) and its clones turn so instead.
	if st.cfg.Root == nil {
		if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, roAttr); err != nil {
			return fmt.Errorf("making / read-only, nosuid and nodev: %w", err)
		}
	}
	if err := cloneRunPaths(st, &clones); err != nil {
		return err
	}
	if st.cfg.Root != nil {
		// Everything the task keeps of the node is cloned: into the
		// image's root, where the rest of the step happens.
		if err := enterRoot(st, tree); err != nil {
			return err
		}
	}
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting the node's /proc: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := mountDev(&clones); err != nil {
		return err
	}
	if err := mountTerminalPts(st); err != nil {
		return err
	}
	if err := mountRun(&clones); err != nil {
		return err
	}
	if err := mountTaskTmp(st); err != nil {
		return err
	}
	if err := sealTaskTmpfs(); err != nil {
		return err
	}
	masks := slices.Concat(kernelMasks, st.cfg.Mask)
	if st.cfg.Loopback || st.cfg.NetNS {
		masks = append(masks, netMasks...)
	}
	for _, path := range masks {
		if err := mask(path); err != nil {
			return err
		}
	}
	if st.cfg.Workspace == nil {
		if err := bridgeUnsearchable(wd); err != nil {
			return err
		}
		if err := os.MkdirAll(wd, 0o755); err != nil && !errors.Is(err, unix.EROFS) {
			return fmt.Errorf("making mount point %s: %w", wd, err)
		}
	}
	// The working directory's mounts come from before the tree turned
	// nosuid: they become nosuid and nodev too.
	wdAttr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, wdAttr); err != nil {
		return fmt.Errorf("making working directory %s nosuid: %w", wd, err)
	}
	if st.cfg.Workspace != nil {
		// Attached by the user step, below the home tmpfs that would
		// hide it if it were attached now.
		st.ws.tree, tree = tree, -1
		return nil
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, wd, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting working directory %s: %w", wd, err)
	}
	return nil
}

// mountTaskTmp mounts the task's size-capped tmpfs on /tmp (but for a
// workspace task, whose /tmp is its workspace's, see workspaceTmp) and
// /dev/shm, and its own mqueue on /dev/mqueue.
func mountTaskTmp(st *state) error {
	opts := "mode=1777"
	if st.cfg.TmpSizeBytes > 0 {
		opts += ",size=" + strconv.FormatInt(st.cfg.TmpSizeBytes, 10) +
			",nr_inodes=" + strconv.FormatInt(tmpInodes(st.cfg.TmpSizeBytes), 10)
	}
	for _, dir := range []string{"/tmp", "/dev/shm"} {
		if dir == "/tmp" && st.cfg.Workspace != nil {
			continue // the workspace's own, bound by the user step (workspaceTmp)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue // nothing to hide where there is no such directory
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mounting tmpfs on %s: %w", dir, err)
		}
	}
	// The task's IPC namespace is new, the node's /dev/mqueue shows the
	// node's queues: a mqueue mounted from here shows the task's own.
	if fi, err := os.Stat("/dev/mqueue"); err == nil && fi.IsDir() {
		if err := unix.Mount("mqueue", "/dev/mqueue", "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mounting mqueue on /dev/mqueue: %w", err)
		}
	}
	return nil
}

// bridgeUnsearchable makes the way to the working directory wd passable
// for the task's UID: the topmost directory above wd that other users
// may not search (a 0700 home holding the agent's work root, say) gets an
// empty tmpfs (mode 0755) in this mount namespace, on which the mount
// step then makes the path down to wd. The task could not reach anything
// of that directory anyway; now it reaches its working directory, from
// any work root the agent was given. A task's UID is never the owner or
// the group of the node's directories, so the execute bit for others is
// what decides (a working directory under /tmp is past the private /tmp
// already, made the same way).
func bridgeUnsearchable(wd string) error {
	var top string
	for p := filepath.Dir(wd); p != "/" && p != "."; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // below a tmpfs of this namespace: made 0755 by the mount step
		case err != nil:
			return fmt.Errorf("checking the way to working directory %s: %w", wd, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			top = p
		}
	}
	if top == "" {
		return nil
	}
	if err := unix.Mount("tmpfs", top, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,nr_inodes=256,mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs over %s, which other users may not search, on the way to working directory %s: %w", top, wd, err)
	}
	return nil
}

// kernelMasks are the node-wide kernel files hidden from every task:
// the kernel log (/dev/kmsg: every process's messages, readable where
// kernel.dmesg_restrict is 0), the kernel's memory and timers, the key
// list, the scheduler's and latency statistics (other tenants' process
// names and pids), and firmware and power-capping interfaces. Missing
// ones are skipped.
var kernelMasks = []string{
	"/dev/kmsg",
	"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug",
	"/proc/latency_stats", "/proc/acpi", "/proc/scsi", "/proc/asound",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

// netMasks hide the node's network interfaces from a task with a network
// namespace of its own (None, Egress, a workspace's): the node's sysfs
// lists every interface of the node's namespace under /sys/class/net,
// other tasks' veth ends among them (/sys/devices/virtual/net), whatever
// the task's namespace holds. The task's own interfaces it sees through
// netlink (ip link), which answers for its namespace.
var netMasks = []string{"/sys/class/net", "/sys/devices/virtual/net"}

// BytesPerTmpInode sizes the inode limit of the task's tmpfs mounts (/tmp,
// /dev/shm and the one holding HOME): one inode per 2 KiB of the size
// cap, at least 1024. The kernel's default, half the node's RAM pages,
// would let a task create millions of empty files, each a few hundred
// bytes of unreclaimable kernel memory that the size cap never sees.
const BytesPerTmpInode = 2048

// tmpInodes is the nr_inodes of a task tmpfs of size bytes.
func tmpInodes(size int64) int64 { return max(size/BytesPerTmpInode, 1024) }

// mask hides path: an empty read-only tmpfs over a directory, /dev/null
// over anything else.
func mask(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("masking %s: %w", path, err)
	case fi.IsDir():
		err = unix.Mount("tmpfs", path, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
	default:
		err = unix.Mount(os.DevNull, path, "", unix.MS_BIND, "")
		if err == nil {
			// A bind takes none of the flags asked with it: read-only
			// and nosuid by a remount (not nodev: it is /dev/null).
			err = unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID, "")
		}
	}
	if err != nil {
		return fmt.Errorf("masking %s: %w", path, err)
	}
	return nil
}

func hostnameStep(st *state) error {
	if st.cfg.Hostname == "" {
		return nil
	}
	return unix.Sethostname([]byte(st.cfg.Hostname))
}

// loopbackStep brings lo up in the task's new network namespace.
func loopbackStep(st *state) error {
	if !st.cfg.Loopback {
		return nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// limitsStep sets RLIMIT_NPROC. The kernel counts it per real UID, so with
// a UID per task it is a limit per task.
//
// With a tmpfs size cap it also bounds SysV shared memory in the task's
// IPC namespace, whose limits (kernel.shmmax, shmall) start unlimited in
// every new namespace: all segments together hold at most the cap, like
// /dev/shm. The sysctls are the namespace's own, written while the shim
// is still root; the task cannot change them.
func limitsStep(st *state) error {
	if size := st.cfg.TmpSizeBytes; size > 0 {
		page := int64(os.Getpagesize())
		for name, v := range map[string]int64{"shmmax": size, "shmall": (size + page - 1) / page} {
			if err := os.WriteFile("/proc/sys/kernel/"+name, []byte(strconv.FormatInt(v, 10)), 0); err != nil {
				return fmt.Errorf("bounding SysV shared memory: %w", err)
			}
		}
	}
	if st.cfg.NProc == 0 {
		return nil
	}
	return unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: st.cfg.NProc, Max: st.cfg.NProc})
}

// identityStep drops this thread (see run) to the task's UID and GID
// with no supplementary groups: the raw system calls, which the kernel
// applies to the calling thread only.
func identityStep(st *state) error {
	if st.cfg.UID == nil || st.cfg.GID == nil {
		return nil
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	// No capability survives in the bounding set, so that nothing the
	// task runs could regain one (no_new_privs already stops setuid and
	// file capabilities; this is the second lock), and the ambient set is
	// empty.
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 && e != unix.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clearing the ambient capabilities: %w", e)
	}
	g, u := uintptr(*st.cfg.GID), uintptr(*st.cfg.UID)
	if st.rootInside() {
		// Root stays root until the fork into the task's user namespace
		// (insideLaunch), but the steps before it (the terminal, the
		// start directory) touch files as the task: fsuid and fsgid.
		_, _, _ = unix.RawSyscall(unix.SYS_SETFSGID, g, 0, 0)
		_, _, _ = unix.RawSyscall(unix.SYS_SETFSUID, u, 0, 0)
		return nil
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, g, g, g); e != 0 {
		return fmt.Errorf("setresgid %d: %w", g, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, u, u, u); e != 0 {
		return fmt.Errorf("setresuid %d: %w", u, e)
	}
	return nil
}

// keyringStep gives this thread (see run), and so the task, a new
// anonymous session keyring of the task's UID instead of the agent's,
// whose keys the task would otherwise possess and see in /proc/keys. The
// filter refuses keyctl, add_key and request_key afterwards, so the task
// cannot put anything in it or in its UID's keyrings, which the kernel
// keeps per UID across tasks.
func keyringStep(st *state) error {
	if st.cfg.UID == nil || st.rootInside() {
		// A root-inside task's second stage joins one as the task.
		return nil
	}
	if _, _, e := unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); e != 0 {
		return fmt.Errorf("joining a new session keyring: %w", e)
	}
	return nil
}

// noNewPrivsStep sets no_new_privs on this thread (see run): no exec of
// the task gains privileges, and Landlock and seccomp may be applied.
func noNewPrivsStep(*state) error {
	return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
}

// superviseShell starts the shell, forwards SIGTERM, SIGINT and SIGHUP to
// every process of the namespace (kill(-1) from PID 1 reaches every other
// process of the namespace), reports the shell's exit, and returns the
// shell's exit code (128+n when signal n killed it) once no child is left.
// sigs receives the shim's caughtSignals.
//
// This goroutine, locked to the process's first thread, waits in wait4
// itself, and a second goroutine forwards signals: were it to wait on a
// channel instead, every event would hand the runtime's one P from this
// locked thread to another and back (two thread wake-ups each, about a
// quarter of a shim's CPU time). A forwarded signal waits for the runtime
// to take the P back from the blocked wait4, at most sysmon's period
// (10 ms), against a grace period of seconds.
func superviseShell(st *state, sigs <-chan os.Signal) (int, error) {
	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	// Nothing but the three streams reaches the shell: the report pipe
	// would let the task forge its own exit status.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, fmt.Errorf("marking descriptors close-on-exec: %w", err)
	}
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	if st.cfg.NullStdin {
		files[0] = devNull
	}
	sys := &syscall.SysProcAttr{Setsid: true}
	path, argv := st.shell, []string{st.shell, "-c", st.cfg.Command}
	var tty *os.File
	if st.tty >= 0 {
		// The terminal's slave on 0, 1 and 2, and the controlling
		// terminal of the shell's new session (TIOCSCTTY on the child's
		// descriptor 0).
		tty = os.NewFile(uintptr(st.tty), "tty")
		st.tty = -1
		files = []*os.File{tty, tty, tty}
		sys.Setctty, sys.Ctty = true, 0
	}
	dir, env := st.cfg.WorkDir, st.cfg.Env
	if ws := st.cfg.Workspace; ws != nil {
		// The workdir step changed to the start directory already.
		dir = ""
		if ws.Carry {
			env = withEnv(env, "BASH_ENV", RCPath)
		}
	}
	if st.rootInside() {
		if path, argv, files, err = insideLaunch(st, argv, files, sys); err != nil {
			return 0, err
		}
		// Root again for the namespace's maps, which the fork writes.
		_, _, _ = unix.RawSyscall(unix.SYS_SETFSUID, 0, 0, 0)
		_, _, _ = unix.RawSyscall(unix.SYS_SETFSGID, 0, 0, 0)
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: files,
		Sys:   sys,
	})
	if tty != nil {
		tty.Close() // the shell's now: the master sees the end once the task's last copy closes
	}
	if st.insideFilter != nil {
		st.insideFilter.Close() // the second stage has its own copy
	}
	if err != nil {
		return 0, err
	}
	shell := proc.Pid
	_ = proc.Release()
	st.fence.afterStart()
	// The shim keeps no copy of the task's streams: once the last process
	// of the task is gone, the executor's readers see EOF.
	for fd := 0; fd <= 2; fd++ {
		_ = unix.Dup3(int(devNull.Fd()), fd, 0)
	}
	devNull.Close()
	w := bufio.NewWriter(st.report)
	_, _ = w.Write(st.ws.workdirReport) // a bufio.Writer's error comes back from Flush
	fmt.Fprintf(w, "started %d\n", shell)
	w.Flush()
	for _, fd := range st.closeAfterStart {
		unix.Close(fd)
	}
	st.closeAfterStart = nil

	go forwardSignals(sigs)
	var shellStatus unix.WaitStatus
	shellDone := false
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.ECHILD):
			if !shellDone {
				return 0, errors.New("the shell was not reaped")
			}
			return exitCode(shellStatus), nil
		case err != nil:
			return 0, fmt.Errorf("waiting for the task's processes: %w", err)
		case pid == shell:
			shellDone, shellStatus = true, ws
			if st.ws.carry >= 0 {
				// The traps ran in the shell before it exited: its record
				// is complete now, or never will be.
				reportCarry(w, st.ws.carry)
				unix.Close(st.ws.carry)
				st.ws.carry = -1
			}
			if st.fence.fenced.Load() {
				fmt.Fprintf(w, "fenced\n")
			}
			fmt.Fprintf(w, "exit %d\n", uint32(ws))
			w.Flush()
		}
	}
}

// caughtSignals are the signals the shim takes from the Go runtime: those
// it forwards (SIGTERM, SIGINT, SIGHUP) and those whose Go runtime default,
// when another process sends them, ends the shim (the runtime's signal
// table marks them kill, throw or panic; a task may signal its PID 1).
// Every other signal gets the runtime's handler, which ignores it when it
// comes from another process, and is reset to its default in the shell at
// exec like the caught ones. The list is short on purpose: each signal
// with the runtime's notify flag costs a round trip between two locked
// threads when it is caught, and catching all of them was about a
// millisecond of CPU per shim.
var caughtSignals = []os.Signal{
	unix.SIGTERM, unix.SIGINT, unix.SIGHUP,
	unix.SIGQUIT, unix.SIGABRT, unix.SIGILL, unix.SIGTRAP, unix.SIGBUS,
	unix.SIGFPE, unix.SIGSEGV, unix.SIGSTKFLT, unix.SIGSYS,
}

// forwardSignals sends SIGTERM, SIGINT and SIGHUP to every other process of
// the namespace and drops every other signal.
func forwardSignals(sigs <-chan os.Signal) {
	for sig := range sigs {
		switch sig {
		case unix.SIGTERM, unix.SIGINT, unix.SIGHUP:
			_ = unix.Kill(-1, sig.(unix.Signal))
		}
	}
}

func exitCode(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// readConfig reads the config socket fd to its end, with the descriptors
// that came with it (SCM_RIGHTS).
func readConfig(fd int) ([]byte, []int, error) {
	var data []byte
	var fds []int
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fds, fmt.Errorf("reading the Config: %w", err)
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return nil, fds, err
			}
			for _, m := range msgs {
				if rights, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, rights...)
				}
			}
		}
		if n == 0 {
			return data, fds, nil
		}
		data = append(data, buf[:n]...)
	}
}
