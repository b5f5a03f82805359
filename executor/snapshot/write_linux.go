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
	"slices"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// readBufBytes is the size of the archiver's read buffer, 1 MiB: large
// reads keep the system calls per GiB in the low thousands.
const readBufBytes = 1 << 20

// WriteOptions configure [Write].
type WriteOptions struct {
	// UID is the workspace's owner: its entries are stored with owner 0.
	UID uint32
	// State are the carried-state files stored after the tree.
	State []StateFile
	// Exclude are names of entries at the top of the tree that are left
	// out, whatever they are (a workspace's temporary directory).
	Exclude []string
	// Upper, when set, is the workspace's overlay upper directory (an
	// open directory, which stays open), archived after the tree as the
	// members UpperPrefix+path: its whiteouts (character devices 0/0) as
	// character devices 0/0, its opaque directories with their
	// trusted.overlay.opaque attribute, set-ID bits as for any file.
	// Other device nodes and other attributes are left out. The overlay's
	// work directory is never archived.
	Upper *os.File
	// Concurrency is how many goroutines compress; 0 means
	// min(GOMAXPROCS, maxParallelJobs). Above 1, the archive is
	// compressed in parallel jobs when no other Write of the process is
	// (parallelWrites), else one block at a time beside the walk.
	Concurrency int
}

// Parallel compression. klauspost/compress's stream encoder compresses one
// block at a time (its concurrency overlaps that block with the filling
// of the next), which bounds a snapshot to one core of compression. With
// zstd.WithConcurrentBlocks it compresses jobs of four windows of input at
// once, each with an overlap of the previous one for its matches, into one
// frame, at a cost in memory of several jobs' input and output held per
// goroutine: with a 1 MiB window (parallelWindowBytes; the archive grows
// by about 0.2 % against SpeedFastest's own 4 MiB, whose jobs held 286
// MiB) `make bench-snapshot` measures 107 MiB of heap with 2 goroutines,
// against 10 MiB one block at a time (docs/performance.md). An agent can be
// asked for several snapshots at once (an interval, an idle suspend and a
// drain of each of its workspaces), so one Write at a time per process
// (parallelWrites) compresses in parallel and the others one block at a
// time: the node's cores are busy either way, and the agent's memory
// stays within its limit.
const (
	// maxParallelJobs bounds the default concurrency.
	maxParallelJobs = 4
	// parallelWindowBytes is the window of a parallel Write, 1 MiB.
	parallelWindowBytes = 1 << 20
)

// parallelWrites holds one token per Write compressing in parallel.
var parallelWrites = make(chan struct{}, 1)

// encoderOptions returns the zstd options of a Write of concurrency conc
// and its release: the parallel token taken, if any.
func encoderOptions(conc int) ([]zstd.EOption, func()) {
	opts := []zstd.EOption{zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(conc)}
	if conc <= 1 {
		return opts, func() {}
	}
	select {
	case parallelWrites <- struct{}{}:
		return append(opts, zstd.WithConcurrentBlocks(true), zstd.WithWindowSize(parallelWindowBytes)), func() { <-parallelWrites }
	default:
		return opts, func() {}
	}
}

// countingHash is the compressed stream's byte count and SHA-256.
type countingHash struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// writer is one archive being written.
type writer struct {
	ctx   context.Context
	tw    *tar.Writer
	uid   uint32
	skip  []string             // top-level names left out (WriteOptions.Exclude)
	links map[[2]uint64]string // (dev, inode) of a multiply linked file -> its first member name
	buf   []byte
	stats Stats
	tree  int // the tree being walked: treeMain, then treeUpper
}

// name is the member name of path rel of the tree being walked.
func (wr *writer) name(rel string, dir bool) string { return memberName(wr.tree, rel, dir) }

// Write archives the tree below root (an open directory, which stays
// open) and then o.State to w, and returns what it wrote. It reads root
// as it is, without stopping anyone writing to it (the package's doc says
// what that gives). A top-level lost+found directory owned by root (made
// by mkfs) is left out, and so is every top-level entry o.Exclude names. Errors are those of reading the tree's
// directories, of w, or ctx's; an entry that vanishes or changes its kind
// while walked is not an error but listed in Stats.Changed.
func Write(ctx context.Context, w io.Writer, root *os.File, o WriteOptions) (*Stats, error) {
	ch := &countingHash{w: w, h: sha256.New()}
	conc := o.Concurrency
	if conc <= 0 {
		conc = min(runtime.GOMAXPROCS(0), maxParallelJobs)
	}
	opts, release := encoderOptions(conc)
	defer release()
	zw, err := zstd.NewWriter(ch, opts...)
	if err != nil {
		return nil, fmt.Errorf("snapshot: the zstd encoder: %w", err)
	}
	wr := &writer{ctx: ctx, tw: tar.NewWriter(zw), uid: o.UID, skip: o.Exclude, links: map[[2]uint64]string{}, buf: make([]byte, readBufBytes)}
	err = wr.archive(int(root.Fd()), o)
	runtime.KeepAlive(root)
	runtime.KeepAlive(o.Upper)
	if cerr := wr.tw.Close(); err == nil {
		err = cerr
	}
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	wr.stats.ArchiveBytes, wr.stats.ArchiveSHA256 = ch.n, hex.EncodeToString(ch.h.Sum(nil))
	return &wr.stats, nil
}

func (wr *writer) archive(rootFD int, o WriteOptions) error {
	version := formatVersion
	if o.Upper != nil {
		version = formatVersionUpper
	}
	if err := wr.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header",
		PAXRecords: map[string]string{paxVersion: version}, Format: tar.FormatPAX,
	}); err != nil {
		return err
	}
	if err := wr.walk(rootFD); err != nil {
		return err
	}
	if o.Upper != nil {
		// A hard link never crosses the two trees.
		wr.tree, wr.skip, wr.links = treeUpper, nil, map[[2]uint64]string{}
		if err := wr.walk(int(o.Upper.Fd())); err != nil {
			return err
		}
	}
	for _, s := range o.State {
		if err := wr.state(s); err != nil {
			return err
		}
	}
	return nil
}

// walk archives the tree of the directory rootFD (the caller's, which
// stays open) as the tree wr.tree.
func (wr *writer) walk(rootFD int) error {
	var st unix.Stat_t
	if err := unix.Fstat(rootFD, &st); err != nil {
		return fmt.Errorf("snapshot: the tree's root: %w", err)
	}
	// The root's descriptor belongs to the caller: walk a duplicate.
	fd, err := unix.Openat(rootFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("snapshot: the tree's root: %w", err)
	}
	if err := wr.headerX(&st, wr.name("", true), tar.TypeDir, "", wr.opaque(fd)); err != nil {
		unix.Close(fd)
		return err
	}
	return wr.dir(fd, "")
}

// opaque is the pax record of an opaque directory fd of the upper
// directory; nil for any other.
func (wr *writer) opaque(fd int) map[string]string {
	if wr.tree != treeUpper {
		return nil
	}
	var b [8]byte
	n, err := unix.Fgetxattr(fd, xattrOpaque, b[:])
	if err != nil || string(b[:n]) != "y" {
		return nil
	}
	wr.stats.OpaqueDirs++
	return map[string]string{paxOpaque: "y"}
}

// dir archives the entries of the directory fd (tree path rel) and
// closes fd.
func (wr *writer) dir(fd int, rel string) error {
	d := os.NewFile(uintptr(fd), rel)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return fmt.Errorf("snapshot: reading directory %q: %w", wr.name(rel, true), err)
	}
	slices.Sort(names) // deterministic archives, and links after their first name in a stable order
	defer d.Close()
	for _, name := range names {
		if err := wr.ctx.Err(); err != nil {
			return err
		}
		p := path.Join(rel, name)
		if err := wr.entry(fd, name, p); err != nil {
			return err
		}
	}
	return nil
}

// entry archives the entry name of directory dirFD (tree path p).
func (wr *writer) entry(dirFD int, name, p string) error {
	if p == name && slices.Contains(wr.skip, name) {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			wr.stats.Changed = append(wr.stats.Changed, p)
			return nil
		}
		return fmt.Errorf("snapshot: %q: %w", wr.name(p, false), err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if p == "lost+found" && st.Uid == 0 {
			return nil
		}
		fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return wr.vanished(p, err)
		}
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return fmt.Errorf("snapshot: %q: %w", wr.name(p, true), err)
		}
		if err := wr.headerX(&st, wr.name(p, true), tar.TypeDir, "", wr.opaque(fd)); err != nil {
			unix.Close(fd)
			return err
		}
		return wr.dir(fd, p)
	case unix.S_IFLNK:
		target, err := readlinkat(dirFD, name, st.Size)
		if err != nil {
			return wr.vanished(p, err)
		}
		return wr.header(&st, wr.name(p, false), tar.TypeSymlink, target)
	case unix.S_IFREG:
		return wr.file(dirFD, name, p)
	case unix.S_IFIFO:
		wr.stats.FIFOs++
		return wr.header(&st, wr.name(p, false), tar.TypeFifo, "")
	case unix.S_IFCHR:
		if wr.tree != treeUpper || st.Rdev != 0 {
			break
		}
		// An overlayfs whiteout: a file of the image deleted.
		wr.stats.Whiteouts++
		return wr.header(&st, wr.name(p, false), tar.TypeChar, "")
	}
	if wr.tree == treeUpper {
		p = UpperPrefix + p
	}
	wr.stats.Skipped = append(wr.stats.Skipped, p)
	return nil
}

// vanished takes an entry that could not be opened as it was seen: gone
// (ENOENT), or replaced by a symbolic link or another kind (ELOOP,
// ENOTDIR) while walked. Either is a change, not an error; anything else
// is.
func (wr *writer) vanished(p string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EINVAL) {
		wr.stats.Changed = append(wr.stats.Changed, p)
		return nil
	}
	return fmt.Errorf("snapshot: %q: %w", wr.name(p, false), err)
}

// readlinkat reads a symbolic link's target, growing the buffer past the
// size lstat gave (a target can change in between).
func readlinkat(dirFD int, name string, size int64) (string, error) {
	n := max(int(size)+1, 256)
	for {
		b := make([]byte, n)
		got, err := unix.Readlinkat(dirFD, name, b)
		if err != nil {
			return "", err
		}
		if got < n {
			return string(b[:got]), nil
		}
		if n >= unix.PathMax*4 {
			return "", unix.ENAMETOOLONG
		}
		n *= 2
	}
}

// header writes the member of st (a directory, symbolic link, FIFO or
// whiteout, or a regular file's header before its data).
func (wr *writer) header(st *unix.Stat_t, name string, typ byte, link string) error {
	return wr.headerX(st, name, typ, link, nil)
}

// headerX is header with the member's pax records.
func (wr *writer) headerX(st *unix.Stat_t, name string, typ byte, link string, pax map[string]string) error {
	h := &tar.Header{
		Typeflag:   typ,
		Name:       name,
		Linkname:   link,
		Mode:       int64(st.Mode & 0o7777),
		ModTime:    time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:     tar.FormatPAX,
		PAXRecords: pax,
	}
	wr.owner(st, h)
	switch typ {
	case tar.TypeDir:
		wr.stats.Dirs++
	case tar.TypeSymlink:
		wr.stats.Symlinks++
	}
	if err := wr.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("snapshot: %q: %w", name, err)
	}
	return nil
}

// owner stores the workspace's owner as 0 and counts others.
func (wr *writer) owner(st *unix.Stat_t, h *tar.Header) {
	if st.Uid != wr.uid {
		wr.stats.ForeignOwner++
	}
	h.Uid, h.Gid = 0, 0
}

// file archives a regular file: opened without following links, its
// data ranges found with SEEK_DATA and SEEK_HOLE when it may have holes,
// and checked for a change after the read.
func (wr *writer) file(dirFD int, name, p string) error {
	fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return wr.vanished(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("snapshot: %q: %w", wr.name(p, false), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		// Replaced by another kind between the lstat and the open.
		wr.stats.Changed = append(wr.stats.Changed, p)
		return nil
	}
	member := wr.name(p, false)
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := wr.links[key]; ok {
			wr.stats.HardLinks++
			h := &tar.Header{Typeflag: tar.TypeLink, Name: member, Linkname: first, Mode: int64(st.Mode & 0o7777),
				ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), Format: tar.FormatPAX}
			wr.owner(&st, h)
			return wr.tw.WriteHeader(h)
		}
		wr.links[key] = member
	}
	size := st.Size
	ranges := []dataRange{{0, size}}
	sparse := st.Blocks*512 < size
	if sparse {
		if ranges, err = dataRanges(fd, size); err != nil {
			return fmt.Errorf("snapshot: %q: finding its data: %w", member, err)
		}
	}
	h := &tar.Header{
		Typeflag: tar.TypeReg, Name: member, Mode: int64(st.Mode & 0o7777),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), Format: tar.FormatPAX,
	}
	wr.owner(&st, h)
	var data int64
	for _, r := range ranges {
		data += r.len
	}
	h.Size = data
	if sparse {
		h.PAXRecords = map[string]string{paxSparseMap: formatSparseMap(ranges), paxSparseSize: fmt.Sprint(size)}
	}
	if size == 0 {
		ranges = nil
	}
	if err := wr.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("snapshot: %q: %w", member, err)
	}
	short := false
	for _, r := range ranges {
		n, err := wr.copyRange(f, r)
		if err != nil {
			return fmt.Errorf("snapshot: %q: %w", member, err)
		}
		if n < r.len {
			// Shrunk while read: the header promised r.len bytes, so the
			// rest is zeros, and the file is listed as changed.
			short = true
			if err := wr.zeros(r.len - n); err != nil {
				return fmt.Errorf("snapshot: %q: %w", member, err)
			}
		}
	}
	wr.stats.Files++
	wr.stats.DataBytes += data
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return fmt.Errorf("snapshot: %q: %w", member, err)
	}
	if short || after.Size != st.Size || after.Mtim != st.Mtim || after.Ctim != st.Ctim {
		wr.stats.Changed = append(wr.stats.Changed, p)
	}
	return nil
}

// copyRange copies the file's bytes of r into the archive and returns how
// many the file had (fewer when it shrank meanwhile).
func (wr *writer) copyRange(f *os.File, r dataRange) (int64, error) {
	var done int64
	for done < r.len {
		n := int(min(int64(len(wr.buf)), r.len-done))
		got, err := f.ReadAt(wr.buf[:n], r.off+done)
		if got > 0 {
			if _, werr := wr.tw.Write(wr.buf[:got]); werr != nil {
				return done, werr
			}
			done += int64(got)
		}
		if errors.Is(err, io.EOF) {
			return done, nil
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (wr *writer) zeros(n int64) error {
	clear(wr.buf)
	for n > 0 {
		k := min(n, int64(len(wr.buf)))
		if _, err := wr.tw.Write(wr.buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// dataRanges returns the data ranges of a file of size bytes: SEEK_DATA
// and SEEK_HOLE as the file system reports them (one range of the whole
// file where it cannot tell).
func dataRanges(fd int, size int64) ([]dataRange, error) {
	var rs []dataRange
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off to the end
		}
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return []dataRange{{0, size}}, nil
			}
			return nil, err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		end = min(end, size)
		if end > start {
			rs = append(rs, dataRange{start, end - start})
		}
		off = end
	}
	return rs, nil
}

// state writes one state file.
func (wr *writer) state(s StateFile) error {
	if s.Name == "" || s.Name == "." || s.Name == ".." || path.Base(s.Name) != s.Name || len(s.Data) > MaxStateBytes {
		return fmt.Errorf("snapshot: state file %q: one path element of at most %d bytes", s.Name, MaxStateBytes)
	}
	h := &tar.Header{Typeflag: tar.TypeReg, Name: StatePrefix + s.Name, Mode: int64(s.Mode & 0o777), Size: int64(len(s.Data)), Format: tar.FormatPAX, ModTime: time.Unix(0, 0)}
	if err := wr.tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := wr.tw.Write(s.Data); err != nil {
		return err
	}
	wr.stats.State = append(wr.stats.State, s.Name)
	return nil
}
