package tarcopy

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// MemberError is a member Extract refused or could not write.
type MemberError struct {
	// Name is the member's name as the archive holds it.
	Name string
	// Err says why.
	Err error
}

func (e *MemberError) Error() string { return fmt.Sprintf("archive member %q: %v", e.Name, e.Err) }

func (e *MemberError) Unwrap() error { return e.Err }

// Reasons Extract refuses a member for, each wrapped in a *MemberError.
var (
	// ErrAbsolute: the name starts with "/".
	ErrAbsolute = errors.New("an absolute name")
	// ErrDotDot: a component of the name (or of a hard link's target) is "..".
	ErrDotDot = errors.New(`a ".." component`)
	// ErrOutsideBase: the name is not the copied path or below it.
	ErrOutsideBase = errors.New("not below the copied path")
	// ErrThroughSymlink: a directory on the member's path is a symbolic
	// link; writing there would write wherever the link points.
	ErrThroughSymlink = errors.New("its path goes through a symbolic link")
	// ErrHardLink: a hard link whose target is not a regular file written
	// earlier by this archive.
	ErrHardLink = errors.New("a hard link to something other than a regular file earlier in the archive")
	// ErrDevice: a character or block device node.
	ErrDevice = errors.New("a device node")
	// ErrSpecial: a named pipe or a member type that is not a file,
	// directory or link.
	ErrSpecial = errors.New("not a regular file, directory or link")
	// ErrNotDir: a directory on the member's path, or a directory member,
	// exists as something else.
	ErrNotDir = errors.New("exists and is not a directory")
	// ErrIsDir: a file member where a directory exists.
	ErrIsDir = errors.New("a directory exists there")
)

// Extract reads a tar from r whose members are base or below it (what
// `tar -c base` writes) and writes them to dest:
//
//   - when base is a directory, dest becomes that directory: it is made
//     when missing (its parent must exist) and merged into when it exists,
//     its own mode then left as it is;
//   - otherwise base becomes the file dest, or dest/base when dest is an
//     existing directory.
//
// Nothing is written outside dest (outside dest's parent for a file):
// every name is checked (no absolute name, no "..", below base), no
// member is written through a symbolic link, a hard link must point to a
// regular file written earlier by the same archive, and device nodes and
// named pipes are refused; all writes go through an os.Root as a second
// guard. Permission and sticky bits are kept, symbolic links stay links,
// empty directories are made, and modification times are kept except on
// links. Files belong to the calling user, and so never get the
// set-user-ID or set-group-ID bit: an archive's content is not the
// caller's, and a set-ID file of root's made from it runs as root for
// whoever may execute it. opts.SameOwner (root only) keeps the archive's
// numeric owners and, with them, the set-ID bits, as GNU tar's
// --same-owner does. An existing file or link is replaced; an existing
// directory is never replaced and keeps its owner and mode. The first
// refused member ends the extraction with a *MemberError naming it; what
// was written before stays, as with tar.
func Extract(r io.Reader, base, dest string, opts ExtractOptions) error {
	if base == "" || base == "." || base == ".." || strings.Contains(base, "/") {
		return fmt.Errorf("extracting: base %q is not one path component", base)
	}
	if opts.SameOwner && os.Geteuid() != 0 {
		return errors.New("extracting: keeping the archive's owners needs root (only root may give a file to another user)")
	}
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return errors.New("extracting: the archive is empty")
	}
	if err != nil {
		return fmt.Errorf("extracting: %w", err)
	}
	x := &extractor{base: base, buf: make([]byte, copyBufferBytes), verified: map[string]bool{".": true}, files: map[string]bool{}, modeMask: permBits, sameOwner: opts.SameOwner}
	if opts.SameOwner {
		x.modeMask |= fs.ModeSetuid | fs.ModeSetgid
	}
	if err := x.open(hdr, dest); err != nil {
		return err
	}
	defer x.root.Close()
	for {
		if err := x.member(tr, hdr); err != nil {
			return err
		}
		if x.single {
			// `tar -c file` has one member; whatever follows was not asked for.
			if hdr, err = tr.Next(); !errors.Is(err, io.EOF) {
				if err == nil {
					return &MemberError{Name: hdr.Name, Err: errors.New("a member after the single file copied")}
				}
				return fmt.Errorf("extracting: %w", err)
			}
			break
		}
		hdr, err = tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("extracting: %w", err)
		}
	}
	return x.finishDirs()
}

// ExtractOptions are Extract's choices beyond the archive and the
// destination.
type ExtractOptions struct {
	// SameOwner gives each file, directory and link made the numeric
	// owner and group of its archive member, and keeps the set-user-ID
	// and set-group-ID bits, which Extract otherwise drops. It needs root
	// (chown(2) to another user takes CAP_CHOWN). Use it only for an
	// archive whose owners are meaningful where it is extracted.
	SameOwner bool
}

// extractor is one Extract's state.
type extractor struct {
	base string
	root *os.Root
	// single: base is not a directory; its one member is named file.
	single bool
	file   string
	// verified holds the directories (relative to root) known to be real
	// directories, checked or made by this extraction.
	verified map[string]bool
	// files holds the regular files this archive wrote, the only allowed
	// hard link targets.
	files map[string]bool
	// dirs are the directories made, whose mode and time are applied at
	// the end so that a read-only directory can still receive its members.
	dirs     []dirMeta
	modeMask fs.FileMode
	// sameOwner: ExtractOptions.SameOwner.
	sameOwner bool
	buf       []byte
}

type dirMeta struct {
	rel      string
	mode     fs.FileMode
	mtime    time.Time
	uid, gid int
}

// open decides from the first member whether base is a directory and
// opens the root every member is written under.
func (x *extractor) open(hdr *tar.Header, dest string) error {
	rel, err := x.relName(hdr.Name)
	if err != nil {
		return &MemberError{Name: hdr.Name, Err: err}
	}
	if rel != "." {
		return &MemberError{Name: hdr.Name, Err: fmt.Errorf("the archive does not start with %q itself", x.base)}
	}
	if hdr.Typeflag == tar.TypeDir {
		fi, err := os.Stat(dest)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(dest, 0o700); err != nil {
				return err
			}
			// Made here: it gets the copied directory's mode at the end.
			x.dirs = append(x.dirs, dirMeta{rel: ".", mode: x.mode(hdr), mtime: hdr.ModTime, uid: hdr.Uid, gid: hdr.Gid})
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("%s: cannot copy a directory onto something that is not a directory", dest)
		}
		x.root, err = os.OpenRoot(dest)
		return err
	}
	x.single = true
	parent, name := filepath.Dir(dest), filepath.Base(dest)
	if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
		parent, name = dest, x.base
	}
	x.file = name
	x.root, err = os.OpenRoot(parent)
	return err
}

// relName checks a member's name and returns it relative to base's
// copy: "." for base itself.
func (x *extractor) relName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", ErrAbsolute
	}
	var parts []string
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "..":
			return "", ErrDotDot
		case "", ".":
			continue
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 || parts[0] != x.base {
		return "", ErrOutsideBase
	}
	if len(parts) == 1 {
		return ".", nil
	}
	return filepath.Join(parts[1:]...), nil
}

// mode is the mode a member gets: its permission and sticky bits, and
// set-user-ID and set-group-ID only with the archive's owners.
func (x *extractor) mode(hdr *tar.Header) fs.FileMode {
	return hdr.FileInfo().Mode() & x.modeMask
}

// member writes one member.
func (x *extractor) member(tr *tar.Reader, hdr *tar.Header) error {
	rel, err := x.relName(hdr.Name)
	if err == nil && x.single {
		if rel != "." {
			err = ErrOutsideBase
		}
		rel = x.file
	}
	if err == nil {
		err = x.write(tr, hdr, rel)
	}
	if err != nil {
		var me *MemberError
		if errors.As(err, &me) {
			return err
		}
		return &MemberError{Name: hdr.Name, Err: err}
	}
	return nil
}

func (x *extractor) write(tr *tar.Reader, hdr *tar.Header, rel string) error {
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		return ErrDevice
	case tar.TypeFifo:
		return fmt.Errorf("%w (a named pipe)", ErrSpecial)
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeGNUSparse,
		0: // TypeRegA: a regular file in archives of old tars
	default:
		return fmt.Errorf("%w (type %q)", ErrSpecial, hdr.Typeflag)
	}
	if rel == "." {
		// base's own directory member: dest, opened as the root.
		if hdr.Typeflag != tar.TypeDir {
			return ErrNotDir
		}
		return nil
	}
	if err := x.parents(rel); err != nil {
		return err
	}
	existing, err := x.root.Lstat(rel)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if hdr.Typeflag == tar.TypeDir {
		switch {
		case !exists:
			if err := x.root.Mkdir(rel, 0o700); err != nil {
				return err
			}
			x.dirs = append(x.dirs, dirMeta{rel: rel, mode: x.mode(hdr), mtime: hdr.ModTime, uid: hdr.Uid, gid: hdr.Gid})
		case !existing.IsDir():
			return ErrNotDir
		}
		x.verified[rel] = true
		return nil
	}
	if exists {
		if existing.IsDir() {
			return ErrIsDir
		}
		// A file or link there is replaced, never written through.
		if err := x.root.Remove(rel); err != nil {
			return err
		}
		delete(x.files, rel)
	}
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		if err := x.root.Symlink(hdr.Linkname, rel); err != nil {
			return err
		}
		if x.sameOwner {
			return x.root.Lchown(rel, hdr.Uid, hdr.Gid)
		}
		return nil
	case tar.TypeLink:
		target, err := x.relName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		if !x.files[target] {
			return fmt.Errorf("%w (target %q)", ErrHardLink, hdr.Linkname)
		}
		return x.root.Link(target, rel)
	}
	f, err := x.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(struct{ io.Writer }{f}, tr, x.buf); err != nil {
		_ = f.Close()
		return err
	}
	// chown(2) clears the set-ID bits, so the owner goes first.
	if x.sameOwner {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := f.Chmod(x.mode(hdr)); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	x.files[rel] = true
	return x.root.Chtimes(rel, hdr.ModTime, hdr.ModTime)
}

// parents checks that every directory on rel's path is a real directory
// (not a symbolic link), making missing ones as tar does.
func (x *extractor) parents(rel string) error {
	dir := filepath.Dir(rel)
	if x.verified[dir] {
		return nil
	}
	parts := strings.Split(dir, string(filepath.Separator))
	for i := range parts {
		p := filepath.Join(parts[:i+1]...)
		if x.verified[p] {
			continue
		}
		fi, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w (%s)", ErrThroughSymlink, p)
		case !fi.IsDir():
			return fmt.Errorf("%s: %w", p, ErrNotDir)
		}
		x.verified[p] = true
	}
	return nil
}

// finishDirs gives the directories made their modes and times, the
// deepest first, so that a read-only directory's contents were written
// and a child's time does not change its parent's afterwards.
func (x *extractor) finishDirs() error {
	for _, d := range slices.Backward(x.dirs) {
		if x.sameOwner {
			if err := x.root.Lchown(d.rel, d.uid, d.gid); err != nil {
				return fmt.Errorf("directory %s: %w", d.rel, err)
			}
		}
		if err := x.root.Chmod(d.rel, d.mode); err != nil {
			return fmt.Errorf("directory %s: %w", d.rel, err)
		}
		if err := x.root.Chtimes(d.rel, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("directory %s: %w", d.rel, err)
		}
	}
	return nil
}
