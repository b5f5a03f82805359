//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Overlayfs's on-disk format for what a layer deletes.
const (
	whiteoutPrefix = ".wh."
	// whiteoutMeta starts names of other layer formats' metadata (aufs's
	// .wh..wh.plnk, .wh..wh.aufs), skipped.
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
	paxXattr       = "SCHILY.xattr."
	// holeBlock is the granularity of holes: a block of this many zero
	// bytes is skipped, not written.
	holeBlock = 4096
	// unpackBuf is the read buffer of regular files.
	unpackBuf = 1 << 20
)

// unpackOptions configure unpack.
type unpackOptions struct {
	// layer is the layer's digest, for errors.
	layer string
	// limit stops the unpack once the layer's file data passes this many
	// bytes (the store's budget); 0: none.
	limit int64
}

// unpackStats count what a layer held.
type unpackStats struct {
	// bytes of file data written (holes not counted).
	bytes int64
	UnpackCounts
}

// unpacker is one layer being unpacked.
type unpacker struct {
	ctx     context.Context
	o       unpackOptions
	root    int
	parent  string
	parentD int
	dirs    []dirMeta
	buf     []byte
	zero    []byte
	st      unpackStats
}

// dirMeta is a directory's mode and time, applied after its entries.
type dirMeta struct {
	rel   string
	mode  uint32
	mtime time.Time
}

// unpack writes the layer tar r into dir (an existing empty directory).
// See the package documentation for the rules.
func unpack(ctx context.Context, r io.Reader, dir string, o unpackOptions) (*unpackStats, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	u := &unpacker{ctx: ctx, o: o, root: root, parentD: -1, buf: make([]byte, unpackBuf), zero: make([]byte, holeBlock)}
	defer u.dropParent()
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: layer %s: %w", ErrInvalid, o.layer, err)
		}
		if err := u.member(h, tr); err != nil {
			var me *MemberError
			if errors.As(err, &me) {
				return nil, err
			}
			return nil, fmt.Errorf("layer %s: member %q: %w", o.layer, h.Name, err)
		}
	}
	return &u.st, u.finishDirs()
}

func (u *unpacker) refuse(h *tar.Header, format string, args ...any) error {
	return &MemberError{Layer: u.o.layer, Member: h.Name, Err: fmt.Errorf(format, args...)}
}

// cleanName checks a member or hard link name and returns it relative to
// the layer's root ("" for the root): no absolute name, no "..".
func cleanName(n string) (string, bool) {
	if strings.HasPrefix(n, "/") {
		return "", false
	}
	var parts []string
	for c := range strings.SplitSeq(n, "/") {
		switch c {
		case "..":
			return "", false
		case "", ".":
			continue
		}
		parts = append(parts, c)
	}
	return strings.Join(parts, "/"), true
}

// member unpacks one member.
func (u *unpacker) member(h *tar.Header, tr *tar.Reader) error {
	rel, ok := cleanName(h.Name)
	if !ok || strings.ContainsRune(rel, 0) {
		return u.refuse(h, "the name leaves the layer (absolute, or a \"..\" component)")
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		// The task gets its own /dev; an image's device nodes are not made.
		u.st.Devices++
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	}
	if rel == "" {
		if h.Typeflag != tar.TypeDir {
			return u.refuse(h, "the layer's root is not a directory")
		}
		u.dirs = append(u.dirs, dirMeta{rel: "", mode: uint32(h.Mode) & 0o7777, mtime: h.ModTime})
		return nil
	}
	dirFD, err := u.parentOf(h, path.Dir(rel))
	if err != nil {
		return err
	}
	leaf := path.Base(rel)
	if strings.HasPrefix(leaf, whiteoutPrefix) {
		return u.whiteout(h, dirFD, rel, leaf)
	}
	if h.Typeflag == tar.TypeDir {
		return u.dir(h, dirFD, rel, leaf)
	}
	if err := u.clear(dirFD, rel, leaf); err != nil {
		return err
	}
	return u.entry(h, tr, dirFD, leaf)
}

// entry makes a member that is not a directory.
func (u *unpacker) entry(h *tar.Header, tr *tar.Reader, dirFD int, leaf string) error {
	mode := uint32(h.Mode) & 0o7777
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse: // the reader reports old tars' TypeRegA as TypeReg
		return u.file(h, tr, dirFD, leaf, mode)
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
			return u.refuse(h, "an empty symbolic link target")
		}
		// The target is stored as it is: it is resolved in the task's
		// root when used, never while unpacking.
		if err := unix.Symlinkat(h.Linkname, dirFD, leaf); err != nil {
			return err
		}
		return u.attrs(h, dirFD, leaf, 0, false)
	case tar.TypeLink:
		return u.link(h, dirFD, leaf)
	case tar.TypeFifo:
		if err := unix.Mkfifoat(dirFD, leaf, 0o600); err != nil {
			return err
		}
		return u.attrs(h, dirFD, leaf, mode, true)
	}
	return u.refuse(h, "member type %q is not unpacked (regular files, directories, symbolic and hard links, FIFOs; device nodes are skipped)", h.Typeflag)
}

// clear removes what an earlier member of the same name made (a later
// member replaces it, as tar does); an existing directory is removed with
// its entries.
func (u *unpacker) clear(dirFD int, rel, leaf string) error {
	var st unix.Stat_t
	err := unix.Fstatat(dirFD, leaf, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirFD, leaf, 0)
	}
	u.dirs = slices.DeleteFunc(u.dirs, func(d dirMeta) bool { return d.rel == rel || strings.HasPrefix(d.rel, rel+"/") })
	return removeTree(dirFD, leaf)
}

// removeTree removes the directory leaf of dirFD and its entries without
// following a symbolic link.
func removeTree(dirFD int, leaf string) error {
	fd, err := unix.Openat(dirFD, leaf, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), leaf)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if uerr := unix.Unlinkat(fd, n, 0); uerr != nil {
				if err = removeTree(fd, n); err != nil {
					break
				}
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirFD, leaf, unix.AT_REMOVEDIR)
}

// dir makes a directory, or takes an existing one's new mode and time.
func (u *unpacker) dir(h *tar.Header, dirFD int, rel, leaf string) error {
	var st unix.Stat_t
	err := unix.Fstatat(dirFD, leaf, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dirFD, leaf, 0); err != nil {
			return err
		}
	}
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Mkdirat(dirFD, leaf, 0o700); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(dirFD, leaf, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return err
	}
	if err := u.xattrs(h, fd); err != nil {
		return err
	}
	u.dirs = append(u.dirs, dirMeta{rel: rel, mode: uint32(h.Mode) & 0o7777, mtime: h.ModTime})
	return nil
}

// whiteout makes overlayfs's form of a deletion: a character device 0/0
// for .wh.NAME, the opaque attribute on the directory for .wh..wh..opq.
func (u *unpacker) whiteout(h *tar.Header, dirFD int, rel, leaf string) error {
	if leaf == whiteoutOpaque {
		if err := unix.Fsetxattr(dirFD, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("marking the directory opaque (%s needs a file system with trusted extended attributes and CAP_SYS_ADMIN): %w", opaqueXattr, err)
		}
		u.st.OpaqueDirs++
		return nil
	}
	if strings.HasPrefix(leaf, whiteoutMeta) {
		return nil
	}
	target := strings.TrimPrefix(leaf, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return u.refuse(h, "a whiteout of no name")
	}
	if err := u.clear(dirFD, path.Join(path.Dir(rel), target), target); err != nil {
		return err
	}
	if err := unix.Mknodat(dirFD, target, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("making the whiteout %s: %w", target, err)
	}
	u.st.Whiteouts++
	return unix.Fchownat(dirFD, target, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW)
}

// link makes a hard link to an entry made earlier by this layer.
func (u *unpacker) link(h *tar.Header, dirFD int, leaf string) error {
	target, ok := cleanName(h.Linkname)
	if !ok || target == "" {
		return u.refuse(h, "hard link target %q leaves the layer", h.Linkname)
	}
	tdir, err := u.openDir(path.Dir(target))
	if err != nil {
		return u.refuse(h, "hard link target %q is not in this layer (a hard link to a file of a lower layer is refused): %v", h.Linkname, err)
	}
	defer unix.Close(tdir)
	var st unix.Stat_t
	if err := unix.Fstatat(tdir, path.Base(target), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return u.refuse(h, "hard link target %q is not a file of this layer (a hard link to a file of a lower layer is refused)", h.Linkname)
	}
	// Without AT_SYMLINK_FOLLOW: the link is to the entry itself.
	return unix.Linkat(tdir, path.Base(target), dirFD, leaf, 0)
}

// attrs gives an entry its owner, then its mode (chown clears set-ID
// bits), then its time; links have no mode of their own.
func (u *unpacker) attrs(h *tar.Header, dirFD int, leaf string, mode uint32, chmod bool) error {
	if err := unix.Fchownat(dirFD, leaf, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if chmod {
		if err := unix.Fchmodat(dirFD, leaf, mode, 0); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(h.AccessTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	if h.AccessTime.IsZero() {
		ts[0] = ts[1]
	}
	return unix.UtimesNanoAt(dirFD, leaf, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// file writes a regular file: its data with holes for zero blocks, then
// owner, mode, extended attributes and time.
func (u *unpacker) file(h *tar.Header, tr *tar.Reader, dirFD int, leaf string, mode uint32) error {
	fd, err := unix.Openat(dirFD, leaf, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), leaf)
	defer f.Close()
	if err := u.data(h, tr, fd); err != nil {
		return err
	}
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	// After the owner: chown clears security.capability.
	if err := u.xattrs(h, fd); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	return f.Close()
}

// data copies a file's content, seeking over every aligned block of
// zeros so that holes stay holes, and sets its size.
func (u *unpacker) data(h *tar.Header, tr *tar.Reader, fd int) error {
	var off int64
	for off < h.Size {
		n, err := io.ReadFull(tr, u.buf[:min(int64(len(u.buf)), h.Size-off)])
		if err != nil {
			return fmt.Errorf("reading the layer: %w", err)
		}
		if err := u.writeRuns(fd, u.buf[:n], off); err != nil {
			return err
		}
		off += int64(n)
		if u.o.limit > 0 && u.st.bytes > u.o.limit {
			return &BudgetError{Ref: "layer " + u.o.layer, Size: u.st.bytes, Budget: u.o.limit}
		}
	}
	return unix.Ftruncate(fd, h.Size)
}

// writeRuns writes the runs of b that are not whole zero blocks at off.
func (u *unpacker) writeRuns(fd int, b []byte, off int64) error {
	start := -1
	for i := 0; i < len(b); i += holeBlock {
		blk := b[i:min(i+holeBlock, len(b))]
		zero := len(blk) == holeBlock && bytes.Equal(blk, u.zero)
		switch {
		case !zero && start < 0:
			start = i
		case zero && start >= 0:
			if err := u.pwrite(fd, b[start:i], off+int64(start)); err != nil {
				return err
			}
			start = -1
		}
	}
	if start >= 0 {
		return u.pwrite(fd, b[start:], off+int64(start))
	}
	return nil
}

func (u *unpacker) pwrite(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
		u.st.bytes += int64(n)
	}
	return nil
}

// keptXattr: user.* and security.capability are kept; trusted.* (which
// would steer overlayfs: opaque, redirect, metacopy), the other
// security.* (SELinux labels, IMA) and system.* (ACLs) are not.
func keptXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || name == "security.capability"
}

// xattrs sets the member's kept extended attributes on fd; a file system
// without support for them skips them, counted.
func (u *unpacker) xattrs(h *tar.Header, fd int) error {
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		if !keptXattr(name) {
			u.st.Xattrs++
			continue
		}
		err := unix.Fsetxattr(fd, name, []byte(v), 0)
		if errors.Is(err, unix.EOPNOTSUPP) {
			u.st.Xattrs++
			continue
		}
		if err != nil {
			return fmt.Errorf("extended attribute %s: %w", name, err)
		}
	}
	return nil
}

// parentOf returns a descriptor of the directory rel ("." for the root),
// made (0755, root's) when missing as tar does, resolved without
// following any symbolic link; it stays cached for the next member.
func (u *unpacker) parentOf(h *tar.Header, rel string) (int, error) {
	if u.parentD >= 0 && u.parent == rel {
		return u.parentD, nil
	}
	u.dropParent()
	fd, err := u.openDir(rel)
	if errors.Is(err, unix.ENOENT) {
		if err = u.makeDirs(rel); err == nil {
			fd, err = u.openDir(rel)
		}
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return -1, u.refuse(h, "its directory %q is a symbolic link or not a directory (members are never written through a link)", rel)
		}
		return -1, err
	}
	u.parent, u.parentD = rel, fd
	return fd, nil
}

func (u *unpacker) dropParent() {
	if u.parentD >= 0 {
		unix.Close(u.parentD)
		u.parentD = -1
	}
}

// openDir opens rel below the root with openat2: beneath it, through no
// symbolic link, on its file system.
func (u *unpacker) openDir(rel string) (int, error) {
	return unix.Openat2(u.root, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// makeDirs makes the missing directories of rel one at a time.
func (u *unpacker) makeDirs(rel string) error {
	cur := "."
	for el := range strings.SplitSeq(rel, "/") {
		fd, err := u.openDir(cur)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(fd, el, 0o755)
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		cur = path.Join(cur, el)
	}
	return nil
}

// finishDirs applies the directories' modes and times, deepest first (a
// directory's time changes with every entry made in it).
func (u *unpacker) finishDirs() error {
	u.dropParent()
	for _, d := range slices.Backward(u.dirs) {
		rel := d.rel
		if rel == "" {
			rel = "."
		}
		fd, err := u.openDir(rel)
		if err != nil {
			return fmt.Errorf("layer %s: directory %q: %w", u.o.layer, d.rel, err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(d.mtime.UnixNano()), unix.NsecToTimespec(d.mtime.UnixNano())}
		err = unix.Fchmod(fd, d.mode)
		if err == nil {
			err = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("layer %s: directory %q: %w", u.o.layer, d.rel, err)
		}
	}
	return nil
}
