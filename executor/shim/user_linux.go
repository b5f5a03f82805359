//go:build linux

package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// nodeUserFiles are the node's passwd and group files as the shim read
// them before its Config arrived (nil when missing), so that a shim
// started ahead of its task does not read them on the task's start.
type nodeUserFiles struct {
	passwd, group []byte
	passwdOK      bool // /etc/passwd exists, a mount point for the task's copy
	groupOK       bool
}

func readNodeUserFiles() nodeUserFiles {
	var f nodeUserFiles
	var err error
	f.passwd, err = os.ReadFile("/etc/passwd")
	f.passwdOK = err == nil
	f.group, err = os.ReadFile("/etc/group")
	f.groupOK = err == nil
	return f
}

// userStep gives the task's UID and GID a name (Config.User): the node's
// passwd and group files (the image's in a task's root, Config.Root;
// imageUserFiles) with the task's entries, written on a private
// tmpfs of the shim's own that no path of the node reaches (fsopen and
// fsmount make it detached), bound read-only over /etc/passwd and
// /etc/group; with PrivateHome the same tmpfs holds the task's home,
// bound over the home's parent directory. The files are a few KiB and
// are written per task, in memory, by the shim while it is still root in
// the task's mount namespace: nothing of it lands on the node's disk and
// nothing needs removing, the mounts end with the namespace.
func userStep(st *state) error {
	u := st.cfg.User
	if u == nil || st.cfg.UID == nil || st.cfg.GID == nil {
		return nil
	}
	if err := u.Validate(); err != nil {
		return err
	}
	uid, gid := *st.cfg.UID, *st.cfg.GID
	mnt, err := st.taskFiles()
	if err != nil {
		return err
	}
	nf := st.nodeUsers
	if st.cfg.Root != nil {
		// The image's files, never the node's; and the mount point of
		// the home, which an image may lack.
		if nf, err = imageUserFiles(st.shell); err != nil {
			return err
		}
		if err := ensureDir(filepath.Dir(u.Home)); err != nil {
			return err
		}
	}
	if nf.passwdOK {
		data := PasswdWithUser(nf.passwd, *u, uid, gid, st.shell)
		if err := writeAt(mnt, "passwd", data); err != nil {
			return err
		}
		if err := bindFrom(mnt, "passwd", "/etc/passwd", true); err != nil {
			return err
		}
	}
	if nf.groupOK {
		if err := writeAt(mnt, "group", GroupWithUser(nf.group, u.Name, gid)); err != nil {
			return err
		}
		if err := bindFrom(mnt, "group", "/etc/group", true); err != nil {
			return err
		}
	}
	if st.cfg.Workspace != nil {
		return workspaceHome(st, mnt, uid, gid)
	}
	if !u.PrivateHome {
		return nil
	}
	home := "home/" + filepath.Base(u.Home)
	if err := unix.Mkdirat(mnt, "home", 0o755); err != nil {
		return fmt.Errorf("making the home directory: %w", err)
	}
	if err := unix.Mkdirat(mnt, home, 0o700); err != nil {
		return fmt.Errorf("making the home directory: %w", err)
	}
	if err := unix.Fchownat(mnt, home, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown of the home directory: %w", err)
	}
	return bindFrom(mnt, "home", filepath.Dir(u.Home), false)
}

// taskFiles is the shim's private tmpfs for the task's files (passwd,
// group, hosts, a private home), made on first use: detached (fsopen and
// fsmount), so no path of the node reaches it, nosuid and nodev, 0755,
// capped at TmpSizeBytes (64 MiB without). It is closed once the shell
// started (state.closeAfterStart); close-on-exec, and every descriptor
// but the streams is marked so before the fork.
func (st *state) taskFiles() (int, error) {
	if st.files >= 0 {
		return st.files, nil
	}
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fsfd)
	sizeBytes := int64(64 << 20)
	if st.cfg.TmpSizeBytes > 0 {
		sizeBytes = st.cfg.TmpSizeBytes
	}
	size, inodes := strconv.FormatInt(sizeBytes, 10), strconv.FormatInt(tmpInodes(sizeBytes), 10)
	for _, kv := range [][2]string{{"mode", "0755"}, {"size", size}, {"nr_inodes", inodes}} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("tmpfs option %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("creating tmpfs: %w", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount tmpfs: %w", err)
	}
	st.files = mnt
	st.closeAfterStart = append(st.closeAfterStart, mnt)
	return mnt, nil
}

// writeAt creates name under the directory dirfd with data, mode 0644,
// owned by root.
func writeAt(dirfd int, name string, data []byte) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("creating the task's %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the task's %s: %w", name, err)
	}
	return nil
}

// bindFrom binds name, under the detached mount dirfd, over target of the
// task's root, read-only when ro.
func bindFrom(dirfd int, name, target string, ro bool) error {
	tree, err := unix.OpenTree(dirfd, name, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cloning the task's %s: %w", name, err)
	}
	defer unix.Close(tree)
	if ro {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
			return fmt.Errorf("making the task's %s read-only: %w", name, err)
		}
	}
	// The target is the node's path (the task has not run yet); a
	// symbolic link there (some distributions link /home) is followed.
	err = unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_SYMLINKS)
	if errors.Is(err, unix.ENOENT) && !ro {
		return fmt.Errorf("mounting the task's home over %s: the node has no such directory", target)
	}
	if err != nil {
		return fmt.Errorf("mounting the task's %s over %s: %w", name, target, err)
	}
	return nil
}
