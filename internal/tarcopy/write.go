// Package tarcopy is the archive side of `kubectl bashtask cp`: Write
// makes a tar of a local file or tree for a workspace task's `tar -x`,
// and Extract unpacks a workspace task's `tar -c` into a local
// directory without ever writing outside it, whatever names the archive
// holds. docs/workspaces.md (Copying files) is the contract.
package tarcopy

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Placeholder is the first name component of every member Write makes.
// The task that extracts the archive renames it (GNU tar --transform) to
// the destination's name once it has looked at the destination, so the
// archive can be made before anyone knows whether the destination is an
// existing directory.
const Placeholder = "_"

// copyBufferBytes is the size of the buffer files are copied through.
const copyBufferBytes = 1 << 20

// permBits are the mode bits a copy keeps: permissions and the sticky
// bit. Set-user-ID and set-group-ID are dropped, as GNU tar does for a
// user other than root: a workspace's tasks never run as root, and a
// local user who is not root would not get them either.
const permBits = fs.ModePerm | fs.ModeSticky

// Write writes a tar of the file, directory tree or symbolic link at
// local to w, every member named Placeholder or below it. Directories are
// walked without following symbolic links (a link is stored as a link,
// also when local itself is one), empty directories are kept, modes are
// kept less set-user-ID and set-group-ID, and owners are not stored (the
// extracting side runs as the workspace's UID). A named pipe, socket or
// device is an error naming it. Hard links are stored as separate files.
func Write(w io.Writer, local string) error {
	tw := tar.NewWriter(w)
	buf := make([]byte, copyBufferBytes)
	fi, err := os.Lstat(local)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if err := writeMember(tw, local, Placeholder, fi, buf); err != nil {
			return err
		}
		return tw.Close()
	}
	err = filepath.WalkDir(local, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(local, p)
		if err != nil {
			return err
		}
		name := Placeholder
		if rel != "." {
			name = Placeholder + "/" + filepath.ToSlash(rel)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return writeMember(tw, p, name, info, buf)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeMember writes one member for the local file p.
func writeMember(tw *tar.Writer, p, name string, fi fs.FileInfo, buf []byte) error {
	var link string
	switch m := fi.Mode(); {
	case m.IsRegular(), m.IsDir():
	case m&fs.ModeSymlink != 0:
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%s: a %s is not copied: only regular files, directories and symbolic links are", p, kind(m))
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	// The owner is the extracting task's; names and IDs from here would
	// mean nothing there.
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	hdr.Mode = int64(tarMode(fi.Mode()))
	// PAX keeps long names, large files and sub-second times.
	hdr.Format = tar.FormatPAX
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyBuffer(tw, struct{ io.Reader }{f}, buf)
	if err != nil {
		if errors.Is(err, tar.ErrWriteTooLong) {
			return fmt.Errorf("%s: the file grew while it was copied", p)
		}
		return fmt.Errorf("%s: %w", p, err)
	}
	if n != fi.Size() {
		return fmt.Errorf("%s: the file shrank from %d to %d bytes while it was copied", p, fi.Size(), n)
	}
	return nil
}

// tarMode is the permission part of a tar header's mode for m: the
// permission bits and the sticky bit in their Unix positions.
func tarMode(m fs.FileMode) uint32 {
	mode := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	default:
		return "special file " + strings.TrimSpace(m.Type().String())
	}
}
