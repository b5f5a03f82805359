//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// workspaceSys is what the executor holds of a workspace on Linux.
type workspaceSys struct {
	mu    sync.Mutex
	root  *os.File       // the root directory, opened without following links; nil once closed
	ns    netns.NsHandle // the workspace's network namespace; -1 for NetworkNode or once closed
	link  *egressLink    // NetworkEgress: its veth pair and address slot
	guard *egressGuard   // NetworkEgress with an egress policy set: its enforcement
	// loop is the loop device (/dev/loopN) of the workspace's file
	// system as it was mounted when the executor took the workspace; ""
	// without one or when it was not found.
	loop   string
	closed bool
	// freezes counts the copies holding the file system frozen
	// (CopyImageFrozen).
	freezes int
}

// OpenWorkspace makes the workspace o describes, or takes up one made
// before (an agent's restart): it creates the workspace's root directory
// (o.ID in the workspaces' directory) when missing, makes the file
// system image or mounts the existing one at the root unless it is
// mounted there already, gives the root to o.UID and o.GID with mode
// 0700, and creates the network namespace (loopback up, and for
// NetworkEgress the veth pair). Nothing of it follows a path a task
// controls: the root's parent is the executor's, o.Image's directory the
// caller's, and the root is opened with O_NOFOLLOW. The error wraps ErrInvalidSpec for
// a size over the cap or an unavailable network, ErrIsolation when the
// executor is not at IsolationTenant.
func (e *Executor) OpenWorkspace(o WorkspaceOptions) (_ *Workspace, err error) {
	if e.isolation != IsolationTenant {
		return nil, fmt.Errorf("%w: workspaces need the tenant isolation level", ErrIsolation)
	}
	if !validName.MatchString(o.ID) || (o.Image != "" && !filepath.IsAbs(o.Image)) {
		return nil, fmt.Errorf("%w: workspace %q must be one path element and its image %q absolute", ErrInvalidConfig, o.ID, o.Image)
	}
	dir := filepath.Join(e.wsDir, o.ID)
	network, err := ParseNetwork(string(o.Network))
	if err != nil {
		return nil, startErr(ErrInvalidSpec, "", err)
	}
	if network == NetworkEgress && e.egress == nil {
		why := "this executor was not configured for it"
		if e.egressErr != nil {
			why = strings.TrimPrefix(e.egressErr.Error(), ErrIsolation.Error()+": ")
		}
		return nil, startErr(ErrInvalidSpec, "network Egress is not available: "+why, nil)
	}
	w := &Workspace{id: o.ID, dir: dir, uid: o.UID, gid: o.GID, network: network}
	w.sys.ns = -1
	var undo []func()
	defer func() {
		if err != nil {
			_ = w.Close()
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	switch err := unix.Mkdir(dir, 0o700); {
	case err == nil:
		undo = append(undo, func() { _ = unix.Rmdir(dir) })
	case !errors.Is(err, unix.EEXIST):
		return nil, fmt.Errorf("making workspace directory %s: %w", dir, err)
	}
	if err := e.workspaceFS(w, o, &undo); err != nil {
		return nil, err
	}
	root, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening workspace root %s: %w", dir, err)
	}
	w.sys.root = root
	if o.TakeOver && w.image != "" {
		// Before anything writes to it: a write waits for the thaw.
		if w.thawedAtOpen, err = thawLeftover(root); err != nil {
			return nil, fmt.Errorf("workspace %s: %w", o.ID, err)
		}
	}
	if err := root.Chown(int(o.UID), int(o.GID)); err != nil {
		return nil, fmt.Errorf("chown of workspace root %s: %w", dir, err)
	}
	if err := root.Chmod(0o700); err != nil {
		return nil, fmt.Errorf("chmod of workspace root %s: %w", dir, err)
	}
	if network == NetworkNone || network == NetworkEgress {
		ns, err := newNetNS()
		if err != nil {
			return nil, fmt.Errorf("the workspace's network namespace: %w", err)
		}
		w.sys.ns = ns
		if network == NetworkEgress {
			if w.sys.link, err = e.egress.attachNS(ns); err != nil {
				return nil, fmt.Errorf("the workspace's network: %w", err)
			}
		}
	}
	return w, nil
}

// workspaceFS gives w its file system: an existing image mounted (unless
// it is already), a new one made where the executor has a disk quota, or
// nothing (a plain directory). undo collects what to take back on a later
// failure.
func (e *Executor) workspaceFS(w *Workspace, o WorkspaceOptions, undo *[]func()) error {
	if o.Image == "" {
		return nil
	}
	fi, err := os.Lstat(o.Image)
	switch {
	case err == nil:
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("workspace image %s is not a regular file", o.Image)
		}
		w.image, w.size = o.Image, fi.Size()
		dev, err := imageMountedAt(o.Image, w.dir)
		if err != nil || dev != "" {
			w.sys.loop = dev
			return err
		}
		img, err := os.OpenFile(o.Image, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening workspace image: %w", err)
		}
		defer img.Close()
		loopCtl := "/dev/loop-control"
		if e.quota != nil {
			loopCtl = e.quota.loopCtl
		}
		if err := mountImage(loopCtl, img, w.dir); err != nil {
			return err
		}
		*undo = append(*undo, func() { _ = unix.Unmount(w.dir, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH) })
		w.sys.loop, _ = imageMountedAt(o.Image, w.dir)
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("workspace image: %w", err)
	case e.quota == nil:
		return nil // the node cannot: a plain directory
	}
	size := o.SizeBytes
	if size == 0 {
		size = e.quota.defBytes
	}
	switch {
	case size > e.quotaCap:
		return startErr(ErrInvalidSpec, fmt.Sprintf("storage of %d bytes is over the agent's cap of %d bytes (--task-disk-cap)", size, e.quotaCap), nil)
	case size < MinDiskQuotaBytes:
		return startErr(ErrInvalidSpec, fmt.Sprintf("storage of %d bytes is below the smallest workspace file system, %d bytes", size, MinDiskQuotaBytes), nil)
	}
	*undo = append(*undo, func() {
		_ = unix.Unmount(w.dir, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
		_ = os.Remove(o.Image)
	})
	if err := e.quota.makeImageFS(o.Image, w.dir, size); err != nil {
		return err
	}
	w.image, w.size = o.Image, size
	w.sys.loop, _ = imageMountedAt(o.Image, w.dir)
	return nil
}

// imageMountedAt returns the loop device (/dev/loopN) backed by image
// whose file system is mounted at dir in this mount namespace; "" when
// there is none.
func imageMountedAt(image, dir string) (string, error) {
	mounts, err := loopMounts()
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		if m.point == dir && loopBacking(m.dev) == image {
			return m.dev, nil
		}
	}
	return "", nil
}

// loopBacking is the backing file of loop device dev (/dev/loopN), empty
// when it has none.
func loopBacking(dev string) string {
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
}

// imageInUse reports whether a loop device is backed by image: a mount of
// its file system is left in some mount namespace. It reads every loop
// device's backing file: on a node of a thousand workspaces a thousand
// files, for each of Remove's polls (see Workspace.loopInUse).
func imageInUse(image string) bool {
	devs, _ := filepath.Glob("/sys/block/loop*")
	for _, d := range devs {
		if loopBacking(d) == image {
			return true
		}
	}
	return false
}

// newNetNS creates a network namespace with loopback up and returns a
// descriptor of it, without moving the caller: the creating thread is
// locked, returned to its namespace and only then unlocked (a thread
// that cannot go back stays locked, and the runtime ends it with the
// goroutine).
func newNetNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	if err := netns.Set(orig); err != nil {
		ns.Close()
		return -1, fmt.Errorf("returning to the agent's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return -1, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		ns.Close()
		return -1, fmt.Errorf("bringing lo up: %w", err)
	}
	return ns, nil
}

// netnsFD is the descriptor of the workspace's network namespace, -1 for
// NetworkNode; the error says the workspace was closed.
func (w *Workspace) netnsFD() (int, error) {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.closed {
		return -1, fmt.Errorf("workspace %s is closed", w.id)
	}
	return int(w.sys.ns), nil
}

// UsedBytes is what the workspace's file system holds, in bytes, from
// statfs(2) of its root as the executor opened it (no walk of the
// task's files); 0 for a plain directory.
func (w *Workspace) UsedBytes() (int64, error) {
	if w.image == "" {
		return 0, nil
	}
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.root == nil {
		return 0, fmt.Errorf("workspace %s is closed", w.id)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(w.sys.root.Fd()), &st); err != nil {
		return 0, fmt.Errorf("statfs of workspace %s: %w", w.id, err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// Close ends the executor's hold on the workspace: its network namespace
// (with the veth pair of NetworkEgress) and its root's descriptor. The
// files and the mount stay, for OpenWorkspace of a later executor. Tasks
// of the workspace must have ended; it is safe more than once.
func (w *Workspace) Close() error {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.closed {
		return nil
	}
	w.sys.closed = true
	if w.sys.root != nil {
		w.sys.root.Close()
		w.sys.root = nil
	}
	if w.sys.ns >= 0 {
		w.sys.ns.Close()
		w.sys.ns = -1
	}
	if w.sys.guard != nil {
		w.sys.guard.close()
		w.sys.guard = nil
	}
	w.sys.link.release()
	w.sys.link = nil
	return nil
}

// unmountWait bounds the wait for a workspace's file system to come free
// in the agent's mount namespace (EBUSY while a process of the workspace
// is still on its way out).
const unmountWait = 5 * time.Second

// heldWait bounds the wait, after the unmount, for the image's loop
// device to be let go by every other mount namespace. The mount
// namespaces of the workspace's tasks go with their last process, which
// Remove's caller has stopped; a namespace made elsewhere while the file
// system was mounted (a task shim of another agent on the same host, which
// detaches only its own agent's workspaces) keeps a copy until it ends.
// That copy is no reason to fail the deletion: the image is unlinked, no
// process of the workspace's UID is left to use it, the root of the file
// system is mode 0700 to that UID, and the loop device (LO_FLAGS_AUTOCLEAR)
// frees the image's blocks when the last copy goes.
const heldWait = 500 * time.Millisecond

// Remove deletes the workspace: Close, then its file system unmounted
// (without MNT_DETACH, so that a process still inside makes it fail
// rather than leave it mounted out of sight) and its image deleted, or a
// plain directory removed without following a symbolic link (its root
// taken back by root first, so the workspace's UID cannot enter while it
// goes), then the root directory. Every process of the workspace's UID
// must be gone. A copy of the mount in another mount namespace is waited
// for at most heldWait and then left to the loop device to free.
func (w *Workspace) Remove() error {
	_ = w.Close()
	var errs []error
	if w.image != "" {
		if err := unmountBusy(w.dir); err != nil {
			errs = append(errs, err)
		}
		if err := os.Remove(w.image); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		for deadline := time.Now().Add(heldWait); w.loopInUse() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	} else {
		if err := os.Lchown(w.dir, 0, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		// os.RemoveAll opens each directory relative to its parent with
		// O_NOFOLLOW and unlinks with unlinkat: a symbolic link is
		// removed, never followed.
		if err := os.RemoveAll(w.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing workspace directory %s: %w", w.dir, err))
		}
	}
	if err := unix.Rmdir(w.dir); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("removing workspace directory %s: %w", w.dir, err))
	}
	return errors.Join(errs...)
}

// loopInUse reports whether the workspace's image still backs a loop
// device once its mount here is gone: the device it was mounted from
// when the executor took the workspace (the image is attached to no other:
// it is mounted once, and deleted before this is asked), or any when that
// device is not known. The device clears itself when the last mount of
// its file system, in any mount namespace, goes.
func (w *Workspace) loopInUse() bool {
	if w.sys.loop == "" {
		return imageInUse(w.image)
	}
	return loopBacking(w.sys.loop) == w.image
}

// unmountBusy unmounts dir, retrying for unmountWait while it is busy.
func unmountBusy(dir string) error {
	deadline := time.Now().Add(unmountWait)
	for {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case !errors.Is(err, unix.EBUSY) || time.Now().After(deadline):
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StartDir is, for a workspace task, the directory its shell started in
// as the task sees it, and why it is not the one asked for (empty when
// it is); empty strings for other tasks.
func (t *Task) StartDir() (dir, note string) {
	if ts := t.sys.tenant; ts != nil && ts.startDir != nil {
		return ts.startDir.Dir, ts.startDir.Note
	}
	return "", ""
}

// workspaceResult adds a workspace task's start directory and carry
// record to res, once the task is over.
func (t *Task) workspaceResult(res *Result) {
	wt, ts := t.spec.Workspace, t.sys.tenant
	if wt == nil || ts == nil {
		return
	}
	dir, note := t.StartDir()
	res.StartDir = dir
	if note != "" {
		res.Message += "; " + note
	}
	if !wt.Carry && !wt.CarryEnv {
		return
	}
	c := &Carry{}
	switch r := ts.carry; {
	case r == nil:
		c.Why = "the task's shim ended without reporting the shell's record"
	case r.Recorded:
		c.Recorded, c.Dir = true, r.Dir
		for _, kv := range r.Env {
			name, value, _ := strings.Cut(kv, "=")
			c.Env = append(c.Env, EnvVar{Name: name, Value: value})
		}
	case r.Why == shim.CarryNothing && res.Signal == "SIGKILL":
		c.Why = "the shell was killed (SIGKILL) before it could record where it ended"
	case r.Why == shim.CarryNothing:
		c.Why = "the shell ended without running the workspace's EXIT trap: the command replaced the shell (exec) or set an EXIT trap of its own"
	default:
		c.Why = r.Why
	}
	res.Carry = c
}

// setupWorkspaceDir makes the workspaces' directory at IsolationTenant: a
// directory of root's (0700) bound onto itself, unless it is a mount point
// already (an earlier executor's, with the workspaces still mounted), and
// made private, so that the workspaces mounted below it propagate
// nowhere; the shims detach it (shimArgv).
func (e *Executor) setupWorkspaceDir(cfg Config) error {
	if e.isolation != IsolationTenant {
		return nil
	}
	dir := cfg.WorkspaceDir
	if dir == "" {
		dir = filepath.Join(e.workRoot, "workspaces")
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: workspace directory %q is not absolute", ErrInvalidConfig, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making the workspaces' directory: %w", err)
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the workspaces' directory %s onto itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making the workspaces' directory %s private: %w", dir, err)
	}
	e.wsDir = dir
	return nil
}

// isMountPoint reports whether dir is a mount point in this mount
// namespace (/proc/self/mountinfo).
func isMountPoint(dir string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && unescapeMountinfo(f[4]) == dir {
			return true, nil
		}
	}
	return false, nil
}

// shimArgv is the argument vector of a task's shim: shim.Arg0 and the
// directories it detaches at its start.
func (e *Executor) shimArgv() []string {
	if e.wsDir == "" {
		return []string{shim.Arg0}
	}
	return []string{shim.Arg0, e.wsDir}
}

// WorkspaceDir is the directory workspaces' roots are mounted in
// (Config.WorkspaceDir); empty but at IsolationTenant.
func (e *Executor) WorkspaceDir() string { return e.wsDir }

// closeWorkspaceDir unmounts the workspaces' directory when no workspace
// is mounted below it (a test's executor, or an agent without
// workspaces); with workspaces it stays for the next executor.
func (e *Executor) closeWorkspaceDir() error {
	if e.wsDir == "" {
		return nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(unescapeMountinfo(f[4]), e.wsDir+"/") {
			return nil
		}
	}
	// EBUSY while a process that had the directory open is still on its
	// way out (a pooled shim or a task's process, killed just before, ends
	// asynchronously): asked again for a while.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Unmount(e.wsDir, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil || errors.Is(err, unix.EINVAL):
			return nil
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("unmounting the workspaces' directory %s: %w", e.wsDir, err)
		}
	}
}

// dupRoot duplicates the root's descriptor (close-on-exec).
func (w *Workspace) dupRoot() (int, error) {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.root == nil {
		return -1, fmt.Errorf("workspace %s is closed", w.id)
	}
	fd, err := unix.FcntlInt(w.sys.root.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("workspace %s: duplicating its root's descriptor: %w", w.id, err)
	}
	return fd, nil
}

// RootDirs makes, when missing, the workspace's WorkspaceRootDir with
// "upper" (0755, the mode of the task's /) and "work" (0700) in it, all
// root's, and returns the upper and work directories relative to the
// workspace's root, for [Root.UpperDir] and [Root.WorkDir]. Nothing is
// followed: each level is opened beneath the workspace's root without
// symbolic links, and an existing level not owned by root (made by a
// task, which owns the workspace's root) is an error, never used.
func (w *Workspace) RootDirs() (upper, work string, err error) {
	root, err := w.dupRoot()
	if err != nil {
		return "", "", err
	}
	defer unix.Close(root)
	dir, err := rootOwnedDir(root, WorkspaceRootDir, 0o700, true)
	if err != nil {
		return "", "", fmt.Errorf("workspace %s: %w", w.id, err)
	}
	defer unix.Close(dir)
	// Below a directory of root's, 0700, held open: the task reaches
	// nothing there.
	for _, d := range []struct {
		name string
		mode uint32
	}{{"upper", 0o755}, {"work", 0o700}} {
		// The upper directory's root is the task's once a shim idmapped
		// the layers (docs/images.md): only its parent is checked.
		fd, err := rootOwnedDir(dir, d.name, d.mode, false)
		if err != nil {
			return "", "", fmt.Errorf("workspace %s: %s/%w", w.id, WorkspaceRootDir, err)
		}
		unix.Close(fd)
	}
	return WorkspaceRootDir + "/upper", WorkspaceRootDir + "/work", nil
}

// rootOwnedDir makes name, one path element, in the directory parent
// (mode, root's) when missing, checks that it is a directory (of root's
// when owned) and returns an O_PATH descriptor of it.
func rootOwnedDir(parent int, name string, mode uint32, owned bool) (int, error) {
	if err := unix.Mkdirat(parent, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("making %s: %w", name, err)
	}
	fd, err := unix.Openat2(parent, name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat of %s: %w", name, err)
	}
	if owned && (st.Uid != 0 || st.Gid != 0) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not root's (uid %d): not made for the workspace's image root", name, st.Uid)
	}
	return fd, nil
}
