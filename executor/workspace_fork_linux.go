package executor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// The file system freeze ioctls of linux/fs.h: _IOWR('X', 119, int) and
// _IOWR('X', 120, int).
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// CopyImageFrozen copies w's file system image to dst, a new file in an
// existing directory, while w's file system is frozen (FIFREEZE on its
// root: every write to it blocks, and the kernel writes its dirty data
// out first, so the image is a consistent file system as of the freeze).
// It clones the image (FICLONE) where dst's file system supports
// reflinks and copies its data extents otherwise. Copies of one
// workspace under way at once share one freeze, which ends with the
// last. The error wraps ErrUnsupported for a workspace without a file
// system of its own; dst is removed on any error.
func (w *Workspace) CopyImageFrozen(dst string) (_ *ForkStats, err error) {
	if w.image == "" {
		return nil, fmt.Errorf("%w: workspace %s has no file system of its own to copy", ErrUnsupported, w.id)
	}
	src, err := os.OpenFile(w.image, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the image of workspace %s: %w", w.id, err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating the fork's image: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	if err := w.freeze(); err != nil {
		return nil, err
	}
	st := &ForkStats{Time: time.Now()}
	defer func() {
		st.Frozen = time.Since(st.Time)
		if terr := w.thaw(); err == nil && terr != nil {
			err = terr
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(src.Fd())) == nil {
		st.Method = ForkReflink
		return st, nil
	}
	st.Method = ForkSparseCopy
	st.CopiedBytes, err = copySparse(out, src)
	return st, err
}

// freeze freezes w's file system unless a copy under way holds it
// frozen already.
func (w *Workspace) freeze() error {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.root == nil {
		return fmt.Errorf("workspace %s is closed", w.id)
	}
	if w.sys.freezes == 0 {
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, w.sys.root.Fd(), ioctlFIFREEZE, 0); errno != 0 {
			return fmt.Errorf("freezing the file system of workspace %s (FIFREEZE): %w", w.id, errno)
		}
	}
	w.sys.freezes++
	return nil
}

// thaw ends this copy's hold on the freeze, and the freeze with the last.
func (w *Workspace) thaw() error {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	w.sys.freezes--
	if w.sys.freezes > 0 || w.sys.root == nil {
		return nil
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, w.sys.root.Fd(), ioctlFITHAW, 0); errno != 0 {
		return fmt.Errorf("thawing the file system of workspace %s (FITHAW): %w", w.id, errno)
	}
	return nil
}

// thawLeftover ends a freeze of the file system whose root is root that
// no copy of this process holds (see WorkspaceOptions.TakeOver). It
// reports whether the file system was frozen; EINVAL is the kernel's
// answer for one that was not.
func thawLeftover(root *os.File) (bool, error) {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, root.Fd(), ioctlFITHAW, 0)
	switch errno {
	case 0:
		return true, nil
	case unix.EINVAL:
		return false, nil
	default:
		return false, fmt.Errorf("thawing a freeze left by an earlier process (FITHAW): %w", errno)
	}
}

// copySparse copies src's data extents to out at the same offsets and
// gives out src's size: holes stay holes. It returns the bytes copied.
func copySparse(out, src *os.File) (int64, error) {
	fi, err := src.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return 0, err
	}
	var copied int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		} else if err != nil {
			return copied, fmt.Errorf("SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return copied, fmt.Errorf("SEEK_HOLE: %w", err)
		}
		if err := copyRange(out, src, data, hole-data); err != nil {
			return copied, err
		}
		copied += hole - data
		off = hole
	}
	return copied, nil
}

// copyRange copies n bytes at off of src to the same offset of out
// (copy_file_range, in the kernel).
func copyRange(out, src *os.File, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(src.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if c == 0 {
			return fmt.Errorf("copy_file_range: the source ended %d bytes early", n)
		}
		n -= int64(c)
	}
	return nil
}

// Adopt makes a copy of another workspace's file system this workspace's:
// every entry owned by the source's UID (GID) is given to this
// workspace's, and the tasks' temporary directory (shim.WorkspaceTmpDir)
// is emptied, as a snapshot leaves it out. No task may run in the
// workspace meanwhile: the walk follows no link, and nothing else writes
// the tree. Errors are the first chown or removal that failed.
func (w *Workspace) Adopt(fromUID, fromGID uint32) error {
	if err := os.RemoveAll(filepath.Join(w.dir, shim.WorkspaceTmpDir)); err != nil {
		return fmt.Errorf("emptying the fork's temporary directory: %w", err)
	}
	return filepath.WalkDir(w.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || (st.Uid != fromUID && st.Gid != fromGID) {
			return nil
		}
		uid, gid := int(st.Uid), int(st.Gid)
		if st.Uid == fromUID {
			uid = int(w.uid)
		}
		if st.Gid == fromGID {
			gid = int(w.gid)
		}
		if err := unix.Lchown(p, uid, gid); err != nil {
			return fmt.Errorf("chown of %s in the fork: %w", p, err)
		}
		return nil
	})
}
