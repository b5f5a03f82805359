//go:build linux

package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The task's root file system of Config.Root (docs/images.md, "The
// task's root file system"): the mount step clones from the node what
// the task keeps of it (the working directory's tree, the device files,
// the run paths, resolv.conf), mounts the image's overlay on top of the
// node's root in the shim's own mount namespace, moves into it with
// pivot_root(2) and detaches the node's root; the rest of the mount step
// (/proc, /dev, /run, /tmp, /dev/shm, the masks, the working directory)
// then happens inside the image as it does on the node's root.

// rootMountPoints are the directories the mount step mounts on, made in
// the overlay (its upper directory) when the image lacks them.
var rootMountPoints = []string{"/proc", "/dev", "/run", "/tmp", "/etc"}

// enterRoot mounts the overlay of cfg.Root, tree being the working
// directory's clone (the workspace's root for a workspace task, beneath
// which relative upper and work directories are resolved), and pivots
// into it. It runs after everything the task keeps of the node was
// cloned.
func enterRoot(st *state, tree int) error {
	r := st.cfg.Root
	if err := r.Validate(); err != nil {
		return err
	}
	// The node's resolv.conf as the mount step left it (Config.ResolvConf
	// bound over it), its symbolic links followed: the task's network's.
	resolv := -1
	if fd, err := unix.OpenTree(unix.AT_FDCWD, "/etc/resolv.conf", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC); err == nil {
		resolv = fd
		defer unix.Close(resolv)
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, roAttr); err != nil {
			return fmt.Errorf("making the task's /etc/resolv.conf read-only: %w", err)
		}
	}
	mnt, err := mountOverlay(st, tree)
	if err != nil {
		return err
	}
	defer unix.Close(mnt)
	if err := pivotInto(mnt); err != nil {
		return fmt.Errorf("moving into the root of image %s: %w", r.Image, err)
	}
	for _, d := range rootMountPoints {
		if err := ensureDir(d); err != nil {
			return err
		}
	}
	if resolv >= 0 {
		if err := ensureFile("/etc/resolv.conf"); err != nil {
			return err
		}
		if err := unix.MoveMount(resolv, "", unix.AT_FDCWD, "/etc/resolv.conf", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mounting the task's /etc/resolv.conf: %w", err)
		}
	}
	if st.rootInside() {
		if err := writeAptSandboxConf(st); err != nil {
			return err
		}
	}
	return rootHosts(st)
}

// mountOverlay makes the overlay of r as a detached mount, nosuid and
// nodev: a set-ID file of an image never raises privileges. The upper and
// work directories are given to overlayfs as /proc/self/fd links of
// descriptors opened here, so that relative ones are taken beneath tree.
func mountOverlay(st *state, tree int) (int, error) {
	r := st.cfg.Root
	upper, err := openRootDir(r.UpperDir, tree, r.Image, "upper")
	if err != nil {
		return -1, err
	}
	defer unix.Close(upper)
	lowers := r.LowerDirs
	if st.userns >= 0 {
		if lowers, err = idmapLayers(st, upper); err != nil {
			return -1, fmt.Errorf("root of image %s: %w", r.Image, err)
		}
	}
	work, err := openRootDir(r.WorkDir, tree, r.Image, "work")
	if err != nil {
		return -1, err
	}
	defer unix.Close(work)
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	if err := overlayLowers(fsfd, lowers); err != nil {
		return -1, fmt.Errorf("root of image %s: %w%s", r.Image, err, fsLog(fsfd))
	}
	// redirect_dir and metacopy off whatever the kernel's defaults: an
	// upper directory then holds whole files and plain directories, which
	// a workspace's snapshot archives as they are (docs/images.md, "What
	// a snapshot holds").
	for _, kv := range [][2]string{{"upperdir", fdPath(upper)}, {"workdir", fdPath(work)}, {"redirect_dir", "off"}, {"metacopy", "off"}} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("root of image %s: overlay %s: %w%s", r.Image, kv[0], err, fsLog(fsfd))
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("root of image %s: creating the overlay: %w%s", r.Image, err, fsLog(fsfd))
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("root of image %s: fsmount overlay: %w%s", r.Image, err, fsLog(fsfd))
	}
	return mnt, nil
}

// idmapLayers gives the task the image's root-owned files
// (RootConfig.IDMapped): a clone of each layer directory idmapped with
// the user namespace st.userns (0 is the task's UID and GID), attached
// at /dev/<n> on a tmpfs over the node's /dev of the shim's namespace
// (its device files are cloned already, and the node's root is detached
// with it after the move: overlayfs takes attached layers only), and the
// upper directory's root, the task's / in its root, chowned to the task.
// It returns the layers' new paths, in the order of LowerDirs.
func idmapLayers(st *state, upper int) ([]string, error) {
	r := st.cfg.Root
	if st.cfg.UID == nil || st.cfg.GID == nil {
		return nil, errors.New("idmapped layers without the task's UID and GID")
	}
	defer func() {
		unix.Close(st.userns)
		st.userns = -1
	}()
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY, Userns_fd: uint64(st.userns)}
	clones := make([]int, 0, len(r.LowerDirs))
	defer func() {
		for _, fd := range clones {
			unix.Close(fd)
		}
	}()
	for _, d := range r.LowerDirs {
		fd, err := unix.OpenTree(unix.AT_FDCWD, d, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("cloning layer %s: %w", d, err)
		}
		clones = append(clones, fd)
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			return nil, fmt.Errorf("idmapping layer %s: %w", d, err)
		}
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=64k"); err != nil {
		return nil, fmt.Errorf("mounting the layers' tmpfs: %w", err)
	}
	paths := make([]string, len(clones))
	for i, fd := range clones {
		paths[i] = "/dev/" + strconv.Itoa(i)
		if err := os.Mkdir(paths[i], 0o700); err != nil {
			return nil, fmt.Errorf("making the mount point of layer %s: %w", r.LowerDirs[i], err)
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, paths[i], unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return nil, fmt.Errorf("attaching layer %s: %w", r.LowerDirs[i], err)
		}
	}
	if err := unix.Fchownat(upper, "", int(*st.cfg.UID), int(*st.cfg.GID), unix.AT_EMPTY_PATH); err != nil {
		return nil, fmt.Errorf("chown of the upper directory: %w", err)
	}
	return paths, nil
}

// overlayLowers sets the lower directories, topmost first: one
// "lowerdir+" each (Linux 6.8 on; no escaping, no length limit), else
// one "lowerdir" with the paths joined by ':' and ':' and ',' escaped.
func overlayLowers(fsfd int, dirs []string) error {
	for i, d := range dirs {
		err := unix.FsconfigSetString(fsfd, "lowerdir+", d)
		if i == 0 && errors.Is(err, unix.EINVAL) {
			break
		}
		if err != nil {
			return fmt.Errorf("overlay lower directory %s: %w", d, err)
		}
		if i == len(dirs)-1 {
			return nil
		}
	}
	esc := strings.NewReplacer(`\`, `\\`, ":", `\:`, ",", `\,`)
	parts := make([]string, len(dirs))
	for i, d := range dirs {
		parts[i] = esc.Replace(d)
	}
	if err := unix.FsconfigSetString(fsfd, "lowerdir", strings.Join(parts, ":")); err != nil {
		return fmt.Errorf("overlay lower directories: %w", err)
	}
	return nil
}

// openRootDir opens dir, an upper or work directory: an absolute node
// path as it is, a relative one beneath tree without following any
// symbolic link or crossing a mount (the task may write its workspace,
// not redirect the root's changes).
func openRootDir(dir string, tree int, image, what string) (int, error) {
	var fd int
	var err error
	if filepath.IsAbs(dir) {
		fd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		fd, err = unix.Openat2(tree, dir, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
	}
	if err != nil {
		return -1, fmt.Errorf("root of image %s: opening the %s directory %s: %w", image, what, dir, err)
	}
	return fd, nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// fsLog is the file system context's messages (fsopen(2)), the reason
// overlayfs gives for a refusal, as ": msg; msg", or "".
func fsLog(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 8 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// pivotInto attaches the detached mount mnt on top of the node's root,
// makes it the root (pivot_root(".", ".") from inside it stacks the old
// root on the new one) and detaches the old root: no path of the node's
// root is left in the mount namespace.
func pivotInto(mnt int) error {
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, "/", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching the overlay: %w", err)
	}
	if err := unix.Fchdir(mnt); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the node's root: %w", err)
	}
	return unix.Chdir("/")
}

// ensureDir makes the directory p (root's, 0755, with its parents) in
// the task's root when nothing is there; what is there is left as it is
// (a symbolic link stays one and is followed by the mount on it).
func ensureDir(p string) error {
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return fmt.Errorf("making %s in the task's root: %w", p, err)
	}
	return nil
}

// ensureFile makes p a regular file the mount step can bind a file on:
// anything else at p (a symbolic link, which could lead anywhere in the
// image, or nothing) is replaced by an empty file, root's, 0644.
func ensureFile(p string) error {
	fi, err := os.Lstat(p)
	if err == nil && fi.Mode().IsRegular() {
		return nil
	}
	if err == nil {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("replacing %s in the task's root: %w", p, err)
		}
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		return fmt.Errorf("making %s in the task's root: %w", p, err)
	}
	return nil
}

// rootHosts binds the task's /etc/hosts, read-only: localhost and the
// task's host name (Config.Hostname, else the node's), whatever the
// image has, like a container runtime's.
func rootHosts(st *state) error {
	name := st.cfg.Hostname
	if name == "" {
		name, _ = os.Hostname()
	}
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if name != "" && name != "localhost" {
		hosts += "127.0.1.1\t" + name + "\n"
	}
	mnt, err := st.taskFiles()
	if err != nil {
		return err
	}
	if err := writeAt(mnt, "hosts", []byte(hosts)); err != nil {
		return err
	}
	if err := ensureFile("/etc/hosts"); err != nil {
		return err
	}
	return bindFrom(mnt, "hosts", "/etc/hosts", true)
}

// shellStep picks the task's shell: Config.Shell on the node's root, the
// image's bash (RootShells) in a task's root, whose absence fails the
// task (never another shell in its place).
func shellStep(st *state) error {
	st.shell = st.cfg.Shell
	r := st.cfg.Root
	if r == nil {
		return nil
	}
	for _, p := range RootShells {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			st.shell = p
			return nil
		}
	}
	return fmt.Errorf("image %s has no bash: none of %s is an executable file", r.Image, strings.Join(RootShells, ", "))
}

// imageUserFiles are the image's passwd and group files for the user
// step, with mount points made for the task's copies: a file that is
// missing or no regular file (a symbolic link is not followed) counts as
// empty, and the task's copy then has root besides the task's user.
func imageUserFiles(shell string) (nodeUserFiles, error) {
	f := nodeUserFiles{passwdOK: true, groupOK: true}
	for _, it := range []struct {
		path, minimal string
		data          *[]byte
	}{
		{"/etc/passwd", "root:x:0:0:root:/root:" + shell + "\n", &f.passwd},
		{"/etc/group", "root:x:0:\n", &f.group},
	} {
		if fi, err := os.Lstat(it.path); err == nil && fi.Mode().IsRegular() {
			data, err := os.ReadFile(it.path)
			if err != nil {
				return f, fmt.Errorf("reading the image's %s: %w", it.path, err)
			}
			*it.data = data
			continue
		}
		*it.data = []byte(it.minimal)
		if err := ensureFile(it.path); err != nil {
			return f, err
		}
	}
	return f, nil
}

// rootWritable are the directories of a task's root the Landlock rules
// let the task write, besides those of the node's root: the top-level
// directories of the image (its /etc, /usr, /var, ..., symbolic links
// followed), but not /proc, /dev, /sys and /run, where the task's root is
// the node's kernel's or read-only mounts. What the task may write in
// them is the overlay's permissions' business.
func rootWritable() []string {
	entries, err := os.ReadDir("/")
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range entries {
		switch e.Name() {
		case "proc", "dev", "sys", "run":
			continue
		}
		p := "/" + e.Name()
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		}
	}
	return dirs
}
