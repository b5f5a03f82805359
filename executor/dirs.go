package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// setupSpillDir checks the spill directory, or makes a fresh one when the
// spec names none: 0700 so other users on the node (and other tasks, which
// run as other users) cannot read a task's output. A named directory that
// does not exist yet is created with the first byte of output (spillDir),
// so a task that prints nothing creates nothing.
func (p *prepared) setupSpillDir() error {
	if p.SpillDir == "" {
		dir, err := os.MkdirTemp("", "bashtask-spill-")
		if err != nil {
			return startErr(ErrSpillDir, os.TempDir(), err)
		}
		p.SpillDir, p.ownSpill = dir, true
		p.spill = &spillDir{path: dir, exists: true}
		return nil
	}
	p.spill = &spillDir{path: p.SpillDir}
	fi, err := os.Lstat(p.SpillDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return startErr(ErrSpillDir, p.SpillDir, err)
	}
	if err := checkSpillDir(p.SpillDir, fi); err != nil {
		return err
	}
	p.spill.exists = true
	return nil
}

// checkSpillDir requires a directory (not a symlink to one) without group
// or other permission bits.
func checkSpillDir(path string, fi os.FileInfo) error {
	switch {
	case !fi.IsDir():
		return startErr(ErrSpillDir, path+" is not a directory", nil)
	case fi.Mode().Perm()&0o077 != 0:
		return startErr(ErrSpillDir, fmt.Sprintf("%s has mode %v, want no group or other access", path, fi.Mode().Perm()), nil)
	}
	return nil
}

// spillDir is a task's spill directory, shared by its two streams: the
// first of them to write creates it when it did not exist at Start.
type spillDir struct {
	path   string
	exists bool // checked or made by prepare

	once sync.Once
	err  error
}

// ensure creates the directory with mode 0700 if prepare found none. One
// that appeared since (another process raced to make it) is accepted only
// if it passes the same checks as at Start.
func (d *spillDir) ensure() error {
	d.once.Do(func() {
		if d.exists {
			return
		}
		err := os.Mkdir(d.path, 0o700)
		if errors.Is(err, os.ErrExist) {
			var fi os.FileInfo
			if fi, err = os.Lstat(d.path); err == nil {
				err = checkSpillDir(d.path, fi)
			}
		}
		d.err = err
	})
	return d.err
}

// statWorkDir checks that path, the working directory named as name in
// errors, exists and is a directory, with ErrWorkingDirMissing or
// ErrWorkingDirNotDir when not.
func statWorkDir(path, name string) (os.FileInfo, error) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, startErr(ErrWorkingDirMissing, name, nil)
	case err != nil:
		return nil, startErr(ErrWorkingDirMissing, name, err)
	case !fi.IsDir():
		return nil, startErr(ErrWorkingDirNotDir, name, nil)
	}
	return fi, nil
}

// tenantSharedDirs are where a working directory named in the spec may
// not lie at IsolationTenant: the task's shim mounts a fresh /proc, a
// private /tmp and /dev/shm, and the node's /sys and /dev are the node's;
// the working directory is a writable clone of the node's directory
// placed over the task's view, so one there would show the task the
// node's instead (every process's command line in /proc, what other
// tenants left in /tmp). Fresh working directories, which the executor
// creates under its own root, are not named in the spec.
var tenantSharedDirs = []string{"/proc", "/sys", "/dev", "/tmp"}

// tenantWorkDir checks a working directory named in the spec against what
// IsolationTenant promises and returns it with symbolic links resolved,
// the path the shim then uses. It refuses the root directory, a directory
// in tenantSharedDirs or in a masked path or holding one, and a directory
// every user may write (shared between tenants); the error wraps
// ErrInvalidSpec and says which rule.
func (e *Executor) tenantWorkDir(wd string) (string, error) {
	refuse := func(why string) error {
		return startErr(ErrInvalidSpec, fmt.Sprintf("working directory %s %s; at the tenant isolation level leave spec.workingDir unset for a fresh private directory", wd, why), nil)
	}
	dir, err := filepath.EvalSymlinks(wd)
	if errors.Is(err, os.ErrNotExist) {
		return "", startErr(ErrWorkingDirMissing, wd, nil)
	}
	if err != nil {
		return "", startErr(ErrWorkingDirMissing, wd, err)
	}
	fi, err := statWorkDir(dir, wd)
	if err != nil {
		return "", err
	}
	within := func(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }
	if dir == "/" {
		return "", refuse("is the root directory, which would make the whole file system writable to the task")
	}
	for _, shared := range tenantSharedDirs {
		if within(dir, shared) {
			return "", refuse(fmt.Sprintf("lies in %s, which the task must see as its own, not the node's", shared))
		}
	}
	if e.wsDir != "" && (within(dir, e.wsDir) || within(e.wsDir, dir)) {
		return "", refuse("is or holds the workspaces' directory " + e.wsDir + ", which only workspace tasks see")
	}
	for _, m := range e.mask {
		if within(dir, m) || within(m, dir) {
			return "", refuse(fmt.Sprintf("is or holds %s, which the agent hides from tasks", m))
		}
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return "", refuse("is writable by every user, so other tenants' tasks share it")
	}
	return dir, nil
}

// makeWorkDir creates a fresh working directory owned by the task's user:
// at IsolationTenant with a disk quota the root of a file system of its
// own (diskQuota), else a directory under the work root.
func (e *Executor) makeWorkDir(p *prepared) error {
	if e.quota != nil && e.isolation == IsolationTenant {
		fs, err := e.quota.take(p.Limits.DiskBytes)
		if err != nil {
			return startErr(ErrProcessStart, "making the working directory's file system", err)
		}
		p.WorkingDir, p.ownWorkDir, p.quotaFS = fs.dir, true, fs
		// mkfs makes the root 0755: 0700 as without a quota.
		if err := os.Chmod(fs.dir, 0o700); err != nil {
			return startErr(ErrProcessStart, "chmod working directory "+fs.dir, err)
		}
	} else {
		dir, err := os.MkdirTemp(e.workRoot, "bashtask-work-")
		if err != nil {
			return startErr(ErrWorkingDirMissing, e.workRoot, err)
		}
		p.WorkingDir, p.ownWorkDir = dir, true
	}
	if p.User != nil {
		if err := os.Chown(p.WorkingDir, int(p.User.UID), int(p.User.GID)); err != nil {
			return startErr(ErrProcessStart, "chown working directory "+p.WorkingDir, err)
		}
	}
	return nil
}

// checkDiskLimit refuses a disk size over the cap and notes a quota the
// node cannot give.
func (e *Executor) checkDiskLimit(p *prepared) error {
	if e.isolation != IsolationTenant || !e.quotaWanted {
		// No working directory gets a quota here: a size the task asked
		// for is not enforced.
		p.diskNotEnforced = p.Limits.DiskBytes > 0
		return nil
	}
	if p.Workspace != nil {
		// The workspace's own file system, sized when it was made.
		p.diskNotEnforced = !p.Workspace.Workspace.StorageEnforced()
		return nil
	}
	if d := p.Limits.DiskBytes; d > e.quotaCap {
		return startErr(ErrInvalidSpec, fmt.Sprintf("spec.resources.ephemeralStorage of %d bytes is over the agent's cap of %d bytes (--task-disk-cap)", d, e.quotaCap), nil)
	}
	if d := p.Limits.DiskBytes; d != 0 && d < MinDiskQuotaBytes {
		return startErr(ErrInvalidSpec, fmt.Sprintf("spec.resources.ephemeralStorage of %d bytes is below the smallest working directory file system, %d bytes", d, MinDiskQuotaBytes), nil)
	}
	// A directory the spec names is not fresh and gets no quota.
	p.diskNotEnforced = (e.quota == nil && p.WorkingDir == "") || (p.WorkingDir != "" && p.Limits.DiskBytes > 0)
	return nil
}

// withDiskNotEnforced is notEnforced with LimitEphemeralStorage added when
// the task's working directory gets no quota that it, or the executor,
// asked for.
func (p *prepared) withDiskNotEnforced(notEnforced []string) []string {
	if !p.diskNotEnforced {
		return notEnforced
	}
	return append(notEnforced, LimitEphemeralStorage)
}

// removeWorkDir removes the task's fresh working directory: a file system
// of its own is closed to the task's UID at once and unmounted, its image
// deleted, in the background (quotaFS.retire), without walking the task's
// files; a plain directory is removed with os.RemoveAll, which opens each
// level relative to the last and does not follow symbolic links.
func (p *prepared) removeWorkDir() error {
	if p.quotaFS != nil {
		return p.quotaFS.retire()
	}
	return os.RemoveAll(p.WorkingDir)
}

// cleanupDirs removes what prepare created when the task cannot start.
func (p *prepared) cleanupDirs() {
	if p.ownWorkDir {
		_ = p.removeWorkDir()
	}
	if p.ownSpill {
		os.RemoveAll(p.SpillDir)
	}
	_ = p.removeRoot()
}
