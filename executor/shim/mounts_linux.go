//go:build linux

package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The task's own /dev and /run. The node's /dev holds every device of the
// node, and its /run the node's daemons' sockets (a root-owned 0666
// socket is anybody's to connect to): the task gets a tmpfs of its own on
// each instead, nodev like every other mount it reaches, with the device
// files a shell needs bound from the node's /dev (the only mounts without
// nodev) and the node's /run paths of Config.RunPaths bound back
// read-only.

// taskDevices are the node's device files bound into the task's /dev,
// each skipped where the node has none; /dev/ptmx may be a symbolic link
// (to pts/ptmx, as in a container), which is made again as such.
var taskDevices = []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx"}

// taskDevLinks are the symbolic links of the task's /dev.
var taskDevLinks = [][2]string{
	{"fd", "/proc/self/fd"},
	{"stdin", "/proc/self/fd/0"},
	{"stdout", "/proc/self/fd/1"},
	{"stderr", "/proc/self/fd/2"},
}

// clone is a detached clone of one of the node's paths, attached at path
// in the task's tree.
type clone struct {
	path string
	fd   int    // -1 for a symbolic link
	link string // the link's target when fd is -1
	dir  bool
}

// nodeClones are the clones the mount step attaches in the task's /dev
// and /run.
type nodeClones struct {
	dev, run  []clone
	devMqueue bool // the node has /dev/mqueue: the task gets one
}

func (c *nodeClones) close() {
	for _, l := range [][]clone{c.dev, c.run} {
		for _, cl := range l {
			if cl.fd >= 0 {
				unix.Close(cl.fd)
			}
		}
	}
}

// cloneDevices clones the node's taskDevices and /dev/pts before the
// tree turns nodev, and makes each clone read-only and nosuid.
func cloneDevices(c *nodeClones) error {
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID}
	for _, name := range append(taskDevices, "pts") {
		path := "/dev/" + name
		fi, err := os.Lstat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return fmt.Errorf("checking the node's %s: %w", path, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return fmt.Errorf("reading the node's %s: %w", path, err)
			}
			c.dev = append(c.dev, clone{path: path, fd: -1, link: target})
			continue
		case fi.IsDir() != (name == "pts"):
			continue // not what a task's /dev would have there
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("cloning the node's %s: %w", path, err)
		}
		c.dev = append(c.dev, clone{path: path, fd: fd, dir: fi.IsDir()})
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
			return fmt.Errorf("making the task's %s read-only: %w", path, err)
		}
	}
	fi, err := os.Stat("/dev/mqueue")
	c.devMqueue = err == nil && fi.IsDir()
	return nil
}

// cloneRunPaths clones the node's paths of Config.RunPaths, and the file
// /etc/resolv.conf leads to when that lies under /run (systemd-resolved's
// stub-resolv.conf, or the Egress resolvers bound over it), after the
// tree turned read-only, nosuid and nodev (or, for a task in an image,
// made so one by one): the clones are too. A path
// missing on the node is skipped; one whose symbolic links lead out of
// /run fails the step.
func cloneRunPaths(st *state, c *nodeClones) error {
	paths := st.cfg.RunPaths
	if target := underRun("/etc/resolv.conf"); target != "" {
		paths = append(paths[:len(paths):len(paths)], target)
	}
	for _, p := range paths {
		if err := CheckRunPath(p); err != nil {
			return err
		}
		real, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("run path %s: %w", p, err)
		}
		if CheckRunPath(real) != nil {
			return fmt.Errorf("run path %s leads to %s, outside /run", p, real)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return fmt.Errorf("run path %s: %w", p, err)
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, real, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("cloning run path %s: %w", p, err)
		}
		c.run = append(c.run, clone{path: p, fd: fd, dir: fi.IsDir()})
		if st.cfg.Root != nil {
			// Cloned from a root left writable (enterRoot).
			if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, roAttr); err != nil {
				return fmt.Errorf("making run path %s read-only: %w", p, err)
			}
		}
	}
	return nil
}

// underRun is the file path leads to when that lies under /run, "" when
// it does not or leads nowhere.
func underRun(path string) string {
	real, err := filepath.EvalSymlinks(path)
	if err != nil || CheckRunPath(real) != nil {
		return ""
	}
	return real
}

// taskTmpfs mounts a small tmpfs (root's, 0755, nosuid, nodev, noexec) on
// dir for the task's own /dev or /run.
func taskTmpfs(dir string) error {
	err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=256")
	if err != nil {
		return fmt.Errorf("mounting the task's own %s: %w", dir, err)
	}
	return nil
}

// mountDev puts the task's own /dev over the node's: the cloned devices
// and /dev/pts, the links of taskDevLinks, and the empty directories
// /dev/shm and (where the node has one) /dev/mqueue, mounted next.
func mountDev(c *nodeClones) error {
	if fi, err := os.Stat("/dev"); err != nil || !fi.IsDir() {
		return nil
	}
	if err := taskTmpfs("/dev"); err != nil {
		return err
	}
	if err := attach(c.dev); err != nil {
		return err
	}
	for _, l := range taskDevLinks {
		if err := os.Symlink(l[1], "/dev/"+l[0]); err != nil {
			return fmt.Errorf("making the task's /dev/%s: %w", l[0], err)
		}
	}
	dirs := []string{"/dev/shm"}
	if c.devMqueue {
		dirs = append(dirs, "/dev/mqueue")
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("making the task's %s: %w", d, err)
		}
	}
	return nil
}

// mountRun puts the task's own /run over the node's, with the cloned run
// paths at their paths.
func mountRun(c *nodeClones) error {
	if fi, err := os.Lstat("/run"); err != nil || !fi.IsDir() {
		return nil
	}
	if err := taskTmpfs("/run"); err != nil {
		return err
	}
	return attach(c.run)
}

// attach makes a mount point for each clone at its path (its parent
// directories root's, 0755) and moves the clone there, or makes the
// symbolic link.
func attach(clones []clone) error {
	for i := range clones {
		cl := &clones[i]
		if err := os.MkdirAll(filepath.Dir(cl.path), 0o755); err != nil {
			return fmt.Errorf("making the task's %s: %w", filepath.Dir(cl.path), err)
		}
		var err error
		switch {
		case cl.fd < 0:
			err = os.Symlink(cl.link, cl.path)
		case cl.dir:
			err = os.Mkdir(cl.path, 0o755)
		default:
			err = os.WriteFile(cl.path, nil, 0o644)
		}
		if err != nil {
			return fmt.Errorf("making the task's %s: %w", cl.path, err)
		}
		if cl.fd < 0 {
			continue
		}
		if err := unix.MoveMount(cl.fd, "", unix.AT_FDCWD, cl.path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mounting the node's %s in the task's: %w", cl.path, err)
		}
		unix.Close(cl.fd)
		cl.fd = -1
	}
	return nil
}

// sealTaskTmpfs makes the task's own /dev and /run read-only once
// everything is mounted in them.
func sealTaskTmpfs() error {
	ro := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	for _, dir := range []string{"/dev", "/run"} {
		if err := unix.MountSetattr(unix.AT_FDCWD, dir, 0, ro); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("making the task's %s read-only: %w", dir, err)
		}
	}
	return nil
}
