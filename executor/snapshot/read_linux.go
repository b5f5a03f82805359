//go:build linux

package snapshot

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// ReadOptions configure [Read].
type ReadOptions struct {
	// UID and GID own every restored entry: the workspace's identity on
	// this node.
	UID, GID uint32
	// State receives each state file of the archive; nil drops them.
	State func(StateFile) error
	// Upper opens the workspace's overlay upper directory (empty), into
	// which the members under UpperPrefix are restored, when the first
	// of them is read; nil refuses an archive with such members. The
	// reader closes it.
	Upper func() (*os.File, error)
}

// countingReader is the compressed stream's byte count and SHA-256.
type countingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// reader is one archive being restored.
type reader struct {
	ctx     context.Context
	roots   [2]int   // the tree's root, and the upper directory's (-1 until opened)
	upper   *os.File // the upper directory, once opened
	o       ReadOptions
	buf     []byte
	parentT int    // tree of the cached parent directory descriptor
	parent  string // its path
	parentD int    // -1 when none
	dirs    []restoredDir
	pool    *filePool // completes small files (filepool_linux.go)
	stats   Stats
}

// restoredDir is a directory whose mode and times are applied after its
// entries are made: a directory of mode 0500 takes no new entry, and
// every entry made in it changes its modification time.
type restoredDir struct {
	tree  int
	rel   string
	mode  uint32
	mtime time.Time
}

// Read restores the archive r into root (an open, empty directory, which
// stays open): every entry owned by o.UID and o.GID, with its mode,
// modification time and kind, hard links as links, sparse files with
// their holes. The error wraps ErrFormat for an archive that is not one
// of this package's or holds a member that is not allowed (its message
// names the member); otherwise it is that of r or of the file system
// (ENOSPC when the tree does not fit), or ctx's. What was restored before
// an error stays: the caller removes the directory.
func Read(ctx context.Context, r io.Reader, root *os.File, o ReadOptions) (*Stats, error) {
	cr := &countingReader{r: r, h: sha256.New()}
	zr, err := zstd.NewReader(cr, zstd.WithDecoderConcurrency(min(runtime.GOMAXPROCS(0), 4)), zstd.WithDecoderLowmem(false))
	if err != nil {
		return nil, fmt.Errorf("snapshot: the zstd decoder: %w", err)
	}
	rd := &reader{ctx: ctx, roots: [2]int{int(root.Fd()), -1}, o: o, buf: make([]byte, readBufBytes), parentD: -1, pool: newFilePool(o.UID, o.GID)}
	defer rd.dropParent()
	defer func() {
		if rd.upper != nil {
			rd.upper.Close()
		}
	}()
	err = rd.restore(tar.NewReader(zr))
	// restore waits for the pool before the directories; after an error
	// it has not, and the pool's goroutines and open files end here.
	if perr := rd.pool.wait(); err == nil {
		err = perr
	}
	runtime.KeepAlive(root)
	// The decoder reads ahead on a goroutine of its own: it stops before
	// anything else reads the stream.
	zr.Close()
	if err != nil {
		return nil, err
	}
	// Whatever follows the tar's end marker still counts for the digest.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return nil, fmt.Errorf("snapshot: reading the archive: %w", err)
	}
	rd.stats.ArchiveBytes, rd.stats.ArchiveSHA256 = cr.n, hex.EncodeToString(cr.h.Sum(nil))
	return &rd.stats, nil
}

func (rd *reader) restore(tr *tar.Reader) error {
	versioned := false
	for {
		if err := rd.ctx.Err(); err != nil {
			return err
		}
		if err := rd.pool.err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrFormat, err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			if v := h.PAXRecords[paxVersion]; v != formatVersion && v != formatVersionUpper {
				return fmt.Errorf("%w: version %q, this agent reads versions %s and %s", ErrFormat, v, formatVersion, formatVersionUpper)
			}
			versioned = true
			continue
		}
		if !versioned {
			return fmt.Errorf("%w: member %q before the global header with the format version", ErrFormat, h.Name)
		}
		if strings.HasPrefix(h.Name, StatePrefix) {
			if err := rd.state(h, tr); err != nil {
				return err
			}
			continue
		}
		if err := rd.member(h, tr); err != nil {
			return err
		}
	}
	if !versioned {
		return fmt.Errorf("%w: no global header with the format version (an empty or foreign stream)", ErrFormat)
	}
	// The directories' modes and times come after every file in them is
	// complete.
	if err := rd.pool.wait(); err != nil {
		return err
	}
	return rd.finishDirs()
}

// member restores one tree member.
func (rd *reader) member(h *tar.Header, tr *tar.Reader) error {
	t, rel, err := memberPath(h.Name)
	if err != nil {
		return err
	}
	if t == treeUpper {
		if err := rd.openUpper(h.Name); err != nil {
			return err
		}
	}
	mode := uint32(h.Mode) & 0o7777
	if rel == "" {
		if h.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: member %q: the tree's root must be a directory", ErrFormat, h.Name)
		}
		rd.dirs = append(rd.dirs, restoredDir{tree: t, rel: "", mode: mode, mtime: h.ModTime})
		return rd.opaque(t, rd.roots[t], h)
	}
	dirFD, err := rd.parentOf(t, rel, h.Name)
	if err != nil {
		return err
	}
	leaf := path.Base(rel)
	switch h.Typeflag {
	case tar.TypeDir:
		return rd.dir(t, dirFD, leaf, rel, h, mode)
	case tar.TypeChar:
		return rd.whiteout(t, dirFD, leaf, h)
	case tar.TypeReg:
		return rd.file(dirFD, leaf, h, tr, mode)
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
			return fmt.Errorf("%w: member %q: an empty symbolic link target", ErrFormat, h.Name)
		}
		if err := unix.Symlinkat(h.Linkname, dirFD, leaf); err != nil {
			return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
		}
		rd.stats.Symlinks++
		return rd.attrs(dirFD, leaf, h, 0, false)
	case tar.TypeLink:
		return rd.link(t, dirFD, leaf, h)
	case tar.TypeFifo:
		if err := unix.Mkfifoat(dirFD, leaf, 0o600); err != nil {
			return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
		}
		rd.stats.FIFOs++
		return rd.attrs(dirFD, leaf, h, mode, true)
	default:
		return fmt.Errorf("%w: member %q: type %q is not restored (only directories, regular files, symbolic and hard links and FIFOs)", ErrFormat, h.Name, h.Typeflag)
	}
}

// dir restores a directory, opaque when it is one of the upper
// directory's so marked.
func (rd *reader) dir(t, dirFD int, leaf, rel string, h *tar.Header, mode uint32) error {
	if err := unix.Mkdirat(dirFD, leaf, 0o700); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	if err := unix.Fchownat(dirFD, leaf, int(rd.o.UID), int(rd.o.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	rd.stats.Dirs++
	rd.dirs = append(rd.dirs, restoredDir{tree: t, rel: rel, mode: mode, mtime: h.ModTime})
	if h.PAXRecords[paxOpaque] == "" {
		return nil
	}
	fd, err := unix.Openat(dirFD, leaf, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	defer unix.Close(fd)
	return rd.opaque(t, fd, h)
}

// opaque sets trusted.overlay.opaque=y on the directory fd of the upper
// directory when its member says so; the attribute is refused on a
// member of the workspace's tree, where it would mean nothing.
func (rd *reader) opaque(t, fd int, h *tar.Header) error {
	v, ok := h.PAXRecords[paxOpaque]
	switch {
	case !ok:
		return nil
	case t != treeUpper || v != "y":
		return fmt.Errorf("%w: member %q: %s=%q only marks a directory of %q opaque (\"y\")", ErrFormat, h.Name, xattrOpaque, v, UpperPrefix)
	}
	if err := unix.Fsetxattr(fd, xattrOpaque, []byte("y"), 0); err != nil {
		return fmt.Errorf("snapshot: member %q: setting %s: %w", h.Name, xattrOpaque, err)
	}
	rd.stats.OpaqueDirs++
	return nil
}

// whiteout restores an overlayfs whiteout of the upper directory: a
// character device 0/0. Any other device, or one in the workspace's
// tree, is refused.
func (rd *reader) whiteout(t, dirFD int, leaf string, h *tar.Header) error {
	if t != treeUpper || h.Devmajor != 0 || h.Devminor != 0 {
		return fmt.Errorf("%w: member %q: a character device is restored only as a whiteout (0/0) of %q", ErrFormat, h.Name, UpperPrefix)
	}
	if err := unix.Mknodat(dirFD, leaf, unix.S_IFCHR|0o600, 0); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	rd.stats.Whiteouts++
	return rd.attrs(dirFD, leaf, h, uint32(h.Mode)&0o777, true)
}

// openUpper opens the upper directory when the first of its members
// comes.
func (rd *reader) openUpper(member string) error {
	if rd.upper != nil {
		return nil
	}
	if rd.o.Upper == nil {
		return fmt.Errorf("%w: member %q: this workspace has no overlay upper directory to restore into (a workspace without an image)", ErrFormat, member)
	}
	f, err := rd.o.Upper()
	if err != nil {
		return fmt.Errorf("snapshot: member %q: opening the upper directory: %w", member, err)
	}
	rd.upper, rd.roots[treeUpper] = f, int(f.Fd())
	return nil
}

// attrs gives the entry leaf of dirFD its owner, then its mode (a chown
// clears set-user-ID bits, so the mode comes after) unless it is a
// symbolic link, then its modification time.
func (rd *reader) attrs(dirFD int, leaf string, h *tar.Header, mode uint32, chmod bool) error {
	if err := unix.Fchownat(dirFD, leaf, int(rd.o.UID), int(rd.o.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	if chmod {
		if err := unix.Fchmodat(dirFD, leaf, mode, 0); err != nil {
			return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
		}
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(h.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(dirFD, leaf, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	return nil
}

// file restores a regular file, sparse when the member has a map.
func (rd *reader) file(dirFD int, leaf string, h *tar.Header, tr *tar.Reader, mode uint32) error {
	size := h.Size
	ranges := []dataRange{{0, h.Size}}
	if m, ok := h.PAXRecords[paxSparseMap]; ok {
		var err error
		if size, err = strconv.ParseInt(h.PAXRecords[paxSparseSize], 10, 64); err != nil || size < 0 {
			return fmt.Errorf("%w: member %q: sparse size %q", ErrFormat, h.Name, h.PAXRecords[paxSparseSize])
		}
		if ranges, err = parseSparseMap(m, size, h.Size); err != nil {
			return fmt.Errorf("%w: member %q: sparse map: %w", ErrFormat, h.Name, err)
		}
	}
	fd, err := unix.Openat(dirFD, leaf, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	rd.stats.Files++
	rd.stats.DataBytes += h.Size
	if h.Size <= poolFileBytes {
		buf, err := rd.pool.buffer(rd.ctx)
		if err != nil {
			unix.Close(fd)
			return err
		}
		buf = buf[:h.Size]
		if _, err := io.ReadFull(tr, buf); err != nil {
			unix.Close(fd)
			rd.pool.release(buf)
			return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
		}
		rd.pool.submit(fileJob{fd: fd, member: h.Name, ranges: ranges, size: size, data: buf, mode: mode, mtime: h.ModTime})
		return nil
	}
	err = rd.streamFile(fd, h, tr, ranges, size, mode)
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("snapshot: member %q: %w", h.Name, cerr)
	}
	return err
}

// streamFile writes a member too large for the pool into the open file
// fd as it reads it, then completes the file.
func (rd *reader) streamFile(fd int, h *tar.Header, tr *tar.Reader, ranges []dataRange, size int64, mode uint32) error {
	for _, r := range ranges {
		for done := int64(0); done < r.len; {
			n, err := io.ReadFull(tr, rd.buf[:min(int64(len(rd.buf)), r.len-done)])
			if err != nil {
				return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
			}
			if err := pwriteFull(fd, rd.buf[:n], r.off+done); err != nil {
				return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
			}
			done += int64(n)
		}
	}
	return completeFile(fd, h.Name, ranges, nil, size, int(rd.o.UID), int(rd.o.GID), mode, h.ModTime)
}

// link restores a hard link to a regular file restored before it.
func (rd *reader) link(t, dirFD int, leaf string, h *tar.Header) error {
	lt, target, err := memberPath(h.Linkname)
	if err != nil || target == "" || lt != t {
		return fmt.Errorf("%w: member %q: hard link target %q is not a file of the tree", ErrFormat, h.Name, h.Linkname)
	}
	oldDir, err := rd.openDir(t, path.Dir(target), h.Name)
	if err != nil {
		return err
	}
	defer unix.Close(oldDir)
	var st unix.Stat_t
	if err := unix.Fstatat(oldDir, path.Base(target), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("snapshot: member %q: hard link target %q: %w", h.Name, h.Linkname, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: member %q: hard link target %q is not a regular file", ErrFormat, h.Name, h.Linkname)
	}
	// Without AT_SYMLINK_FOLLOW: the link is to the entry itself.
	if err := unix.Linkat(oldDir, path.Base(target), dirFD, leaf, 0); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", h.Name, err)
	}
	rd.stats.HardLinks++
	return nil
}

// state hands one state member to o.State.
func (rd *reader) state(h *tar.Header, tr *tar.Reader) error {
	name := strings.TrimPrefix(h.Name, StatePrefix)
	if h.Typeflag != tar.TypeReg || name == "" || path.Base(name) != name || name == "." || name == ".." || h.Size > MaxStateBytes {
		return fmt.Errorf("%w: member %q: a state member is a regular file named by one path element, at most %d bytes", ErrFormat, h.Name, MaxStateBytes)
	}
	data, err := io.ReadAll(io.LimitReader(tr, h.Size))
	if err != nil {
		return fmt.Errorf("%w: member %q: %w", ErrFormat, h.Name, err)
	}
	rd.stats.State = append(rd.stats.State, name)
	if rd.o.State == nil {
		return nil
	}
	return rd.o.State(StateFile{Name: name, Mode: uint32(h.Mode) & 0o777, Data: data})
}

// parentOf returns a descriptor of rel's parent directory, resolved below
// the root without following any symbolic link; it stays cached for the
// next member (an archive lists a directory's entries together).
func (rd *reader) parentOf(t int, rel, member string) (int, error) {
	dir := path.Dir(rel)
	if dir == "." {
		dir = ""
	}
	if rd.parentD >= 0 && rd.parent == dir && rd.parentT == t {
		return rd.parentD, nil
	}
	rd.dropParent()
	fd, err := rd.openDir(t, dir, member)
	if err != nil {
		return -1, err
	}
	rd.parentT, rd.parent, rd.parentD = t, dir, fd
	return fd, nil
}

func (rd *reader) dropParent() {
	if rd.parentD >= 0 {
		unix.Close(rd.parentD)
		rd.parentD = -1
	}
}

// openDir opens the tree directory rel ("" is the root) with openat2:
// beneath the root, through no symbolic link, on the root's file system.
func (rd *reader) openDir(t int, rel, member string) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(rd.roots[t], rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOSYS) {
		return rd.walkDir(t, rel, member)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%w: member %q: its directory %q is not a directory of the archive (a symbolic link or another kind on the way)", ErrFormat, member, rel)
		}
		return -1, fmt.Errorf("snapshot: member %q: its directory %q: %w", member, rel, err)
	}
	return fd, nil
}

// walkDir is openDir for kernels without openat2 (before 5.6): one
// element at a time with O_NOFOLLOW.
func (rd *reader) walkDir(t int, rel, member string) (int, error) {
	fd, err := unix.Openat(rd.roots[t], ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return fd, nil
	}
	for el := range strings.SplitSeq(rel, "/") {
		next, err := unix.Openat(fd, el, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("%w: member %q: its directory %q: %w", ErrFormat, member, rel, err)
		}
		fd = next
	}
	return fd, nil
}

// finishDirs applies the directories' modes and times, deepest first.
func (rd *reader) finishDirs() error {
	rd.dropParent()
	for i := len(rd.dirs) - 1; i >= 0; i-- {
		d := rd.dirs[i]
		fd, err := rd.openDir(d.tree, d.rel, memberName(d.tree, d.rel, true))
		if err != nil {
			return err
		}
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(d.mtime.UnixNano())}
		// The mode only after the owner, as for files.
		err = unix.Fchown(fd, int(rd.o.UID), int(rd.o.GID))
		if err == nil {
			err = unix.Fchmod(fd, d.mode)
		}
		if err == nil {
			err = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("snapshot: directory %q: %w", memberName(d.tree, d.rel, true), err)
		}
	}
	return nil
}
