//go:build linux

package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// wsState is a workspace task's part of the shim's state (descriptors are
// -1 when not open).
type wsState struct {
	tree  int // the workspace's root as a detached mount, until attached
	root  int // O_PATH descriptor of the attached root, for the workdir step
	carry int // the carry record (CarryPath), read once the shell is reaped
	// workdirReport is the "workdir" report line, written with "started".
	workdirReport []byte
	// rc is CarryRC(false) and CarryRC(true), made before the Config
	// arrives.
	rc [2][]byte
}

// netnsStep joins the workspace's network namespace (Config.NetNS) on
// this thread, the one the shell is forked from (see run), before
// anything else: the mounts that follow see it.
func netnsStep(st *state) error {
	if st.netns < 0 {
		return nil
	}
	defer func() {
		unix.Close(st.netns)
		st.netns = -1
	}()
	if err := unix.Setns(st.netns, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("joining the workspace's network namespace: %w", err)
	}
	return nil
}

// workspaceHome finishes the user step of a workspace task on the shim's
// private tmpfs mnt: home/ (root's, 0755) with an empty mount point for
// the workspace (Config.User.Home's base name) and, with Carry, the
// carry directory (CarryDir: root's, 0755) holding the rc file (root's,
// 0644) and the empty carry record (the task's, 0600, on which the shim
// keeps a descriptor). It binds home/ over /home, attaches the workspace
// tree at User.Home and opens the attached root for the workdir step.
func workspaceHome(st *state, mnt int, uid, gid uint32) error {
	ws, u := st.cfg.Workspace, st.cfg.User
	if st.ws.tree < 0 {
		return errors.New("a workspace task without its workspace's tree")
	}
	if filepath.Dir(u.Home) != "/home" || filepath.Dir(CarryDir) != "/home" {
		return fmt.Errorf("a workspace's home %s is not below /home", u.Home)
	}
	if err := unix.Mkdirat(mnt, "home", 0o755); err != nil {
		return fmt.Errorf("making /home: %w", err)
	}
	if err := unix.Mkdirat(mnt, "home/"+filepath.Base(u.Home), 0o755); err != nil {
		return fmt.Errorf("making the workspace's mount point: %w", err)
	}
	if ws.Carry {
		dir := "home/" + filepath.Base(CarryDir)
		if err := unix.Mkdirat(mnt, dir, 0o755); err != nil {
			return fmt.Errorf("making %s: %w", CarryDir, err)
		}
		rc := st.ws.rc[0]
		if ws.CarryEnv {
			rc = st.ws.rc[1]
		}
		if err := writeAt(mnt, dir+"/"+filepath.Base(RCPath), rc); err != nil {
			return err
		}
		fd, err := unix.Openat(mnt, dir+"/"+filepath.Base(CarryPath), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("creating %s: %w", CarryPath, err)
		}
		st.ws.carry = fd
		if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
			return fmt.Errorf("chown of %s: %w", CarryPath, err)
		}
	}
	if err := bindFrom(mnt, "home", "/home", false); err != nil {
		return err
	}
	tree := st.ws.tree
	st.ws.tree = -1
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, u.Home, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting the workspace at %s: %w", u.Home, err)
	}
	root, err := unix.Open(u.Home, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the workspace at %s: %w", u.Home, err)
	}
	st.ws.root = root
	// The task owns the root and may take its own access away (chmod 000
	// ~): every later task, which starts there as the same UID, would
	// fail. The owner's bits come back here, by the descriptor just
	// opened (the magic link of the shim's own /proc), never by a path
	// the task controls.
	var fi unix.Stat_t
	if err := unix.Fstat(root, &fi); err != nil {
		return fmt.Errorf("stat of the workspace's root: %w", err)
	}
	if fi.Mode&0o700 != 0o700 {
		if err := unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", root), fi.Mode&0o7777|0o700); err != nil {
			return fmt.Errorf("giving the workspace's root back its owner's access: %w", err)
		}
	}
	return workspaceTmp(root)
}

// tmpHow resolves WorkspaceTmpDir below the workspace's root without
// following anything the task could have put there: no symbolic link,
// no magic link, no other mount.
var tmpHow = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

// workspaceTmp binds the workspace's temporary directory
// (WorkspaceTmpDir below root, the attached workspace's O_PATH
// descriptor) over /tmp: a clone of that one directory (open_tree of
// its descriptor, never of a path) moved onto /tmp, which the mount step
// left without its tmpfs. So /tmp is on the workspace's file system,
// under its size limit, shared by its tasks and kept between them.
func workspaceTmp(root int) error {
	fd, err := openWorkspaceTmp(root)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("cloning the workspace's %s: %w", WorkspaceTmpDir, err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, "/tmp", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting the workspace's %s at /tmp: %w", WorkspaceTmpDir, err)
	}
	return nil
}

// openWorkspaceTmp opens WorkspaceTmpDir below root, making it (root's,
// mode 1777, as a node's /tmp) when it is missing. Whatever else a task
// left at the name (a symbolic link, a file) is unlinked, never
// followed, and the directory made in its place; a directory the task
// made there itself is the task's own and is used as it is. Tasks of one
// workspace that start at once race to make it: a start that finds it
// made by another (EEXIST) opens that one.
func openWorkspaceTmp(root int) (int, error) {
	how := tmpHow
	for attempt := 0; ; attempt++ {
		fd, err := unix.Openat2(root, WorkspaceTmpDir, &how)
		switch {
		case err == nil:
			if err := settleTmpMode(fd); err != nil {
				unix.Close(fd)
				return -1, err
			}
			return fd, nil
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
			if err := unix.Unlinkat(root, WorkspaceTmpDir, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return -1, fmt.Errorf("removing what is at the workspace's %s: %w", WorkspaceTmpDir, err)
			}
		case !errors.Is(err, unix.ENOENT):
			return -1, fmt.Errorf("opening the workspace's %s: %w", WorkspaceTmpDir, err)
		}
		err = unix.Mkdirat(root, WorkspaceTmpDir, 0o700)
		if errors.Is(err, unix.EEXIST) && attempt < 3 {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("making the workspace's %s: %w", WorkspaceTmpDir, err)
		}
	}
}

// settleTmpMode gives the opened temporary directory mode 1777 when it is
// root's (made by a start: mkdir's mode passed the umask, and another
// start may not have set the mode yet), by the descriptor, which the task
// cannot have replaced. A directory of another owner, the task's own, is
// left as it is.
func settleTmpMode(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat of the workspace's %s: %w", WorkspaceTmpDir, err)
	}
	if st.Uid != 0 || st.Mode&0o7777 == 0o1777 {
		return nil
	}
	if err := unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), 0o1777); err != nil {
		return fmt.Errorf("chmod of the workspace's %s: %w", WorkspaceTmpDir, err)
	}
	return nil
}

// workdirStep changes to a workspace task's start directory as the task's
// user (the identity step ran): StartDir resolved with openat2's
// RESOLVE_IN_ROOT from the workspace's root, so that ".." stops at the
// root and a symbolic link's target is taken inside it, and with
// RESOLVE_NO_MAGICLINKS, so that /proc/self/fd/N leads nowhere; then
// fchdir, which checks the task's search permission. A StartDir that is
// not StartDirRequired and fails starts the shell at the root; either
// way the step prepares the "workdir" report of where the shell starts,
// which goes out in the same write as "started" (one wake-up of the
// parent, not two, on the start's path; a later step's failure reports
// only the error).
func workdirStep(st *state) error {
	ws := st.cfg.Workspace
	if ws == nil {
		return nil
	}
	root := st.ws.root
	defer func() {
		unix.Close(root)
		st.ws.root = -1
	}()
	var note string
	dir := root
	if rel := strings.TrimLeft(ws.StartDir, "/"); rel != "" && rel != "." {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == nil {
			defer unix.Close(fd)
			if err = unix.Fchdir(fd); err == nil {
				dir = -1
			}
		}
		if err != nil {
			view := filepath.Join(st.cfg.User.Home, rel)
			if ws.StartDirRequired {
				return fmt.Errorf("working directory %s in the workspace: %w", view, err)
			}
			note = fmt.Sprintf("the carried working directory %s is gone (%v); the shell starts at %s", view, err, st.cfg.User.Home)
		}
	}
	if dir >= 0 {
		if err := unix.Fchdir(dir); err != nil {
			return fmt.Errorf("changing to the workspace's root: %w", err)
		}
	}
	cwd, err := unix.Getwd()
	if err != nil {
		return fmt.Errorf("the start directory: %w", err)
	}
	b, _ := json.Marshal(StartDir{Dir: cwd, Note: note})
	st.ws.workdirReport = fmt.Appendf(nil, "workdir %s\n", b)
	return nil
}

// reportCarry reads the carry record through fd, the shim's own
// descriptor of it, from its start and at most MaxCarryBytes+1 bytes, and
// reports it. Never by its path: nothing the task controls is followed,
// whatever it did to the file.
func reportCarry(w *bufio.Writer, fd int) {
	rec, over := readCarry(fd)
	c := ParseCarry(rec, over)
	b, err := json.Marshal(c)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "carry %s\n", b)
}

// readCarry reads the record from fd: at most MaxCarryBytes, and over
// when there is more. The buffer is sized by the file's size (a record
// is some bytes for a directory, a few KiB with variables) instead of the
// bound: 256 KiB allocated and zeroed for every task was a tenth of a
// millisecond of the shim's exit. A record that grew after the fstat (a
// process of the task still writing it) is read again with a buffer of
// the bound.
func readCarry(fd int) (rec []byte, over bool) {
	size := int64(MaxCarryBytes)
	var fi unix.Stat_t
	if err := unix.Fstat(fd, &fi); err == nil && fi.Size >= 0 && fi.Size < size {
		size = fi.Size
	}
	buf := make([]byte, size+1)
	n := preadFull(fd, buf)
	if n == len(buf) && size < MaxCarryBytes {
		buf = make([]byte, MaxCarryBytes+1)
		n = preadFull(fd, buf)
	}
	return buf[:min(n, MaxCarryBytes)], n > MaxCarryBytes
}

// preadFull reads fd from offset 0 into buf until buf is full, the end of
// the file or an error, and returns the bytes read.
func preadFull(fd int, buf []byte) int {
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || m == 0 {
			break
		}
		n += m
	}
	return n
}

// withEnv is env with name set to value (an earlier entry replaced).
func withEnv(env []string, name, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

// detachMounts makes every mount of the shim's new mount namespace
// private (so that nothing the agent mounts later propagates into it, and
// nothing unmounted here propagates out) and detaches the mounts at each
// of dirs (a directory that is no mount point is skipped).
func detachMounts(dirs []string) error {
	if len(dirs) == 0 {
		return nil
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	for _, d := range dirs {
		if err := unix.Unmount(d, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detaching %s: %w", d, err)
		}
	}
	return nil
}
