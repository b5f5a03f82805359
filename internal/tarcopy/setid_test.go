package tarcopy

import (
	"archive/tar"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// setIDArchive is what a tenant can leave for a copy out: a set-user-ID
// and set-group-ID file, a set-group-ID directory open to all, and a
// set-user-ID file under it, all of another user (4242).
func setIDArchive(t *testing.T) []member {
	t.Helper()
	return []member{
		{name: "b/", typ: tar.TypeDir, mode: 0o755, uid: 4242, gid: 4242},
		{name: "b/suid", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o4755, uid: 4242, gid: 4242},
		{name: "b/both", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o6755, uid: 4242, gid: 4242},
		{name: "b/shared/", typ: tar.TypeDir, mode: 0o2777, uid: 4242, gid: 4242},
		{name: "b/shared/inner", body: "x", typ: tar.TypeReg, mode: 0o4711, uid: 4242, gid: 4242},
		{name: "b/link", link: "suid", typ: tar.TypeSymlink, mode: 0o777, uid: 4242, gid: 4242},
	}
}

// ownerOf is the numeric owner and group of p, not following a link.
func ownerOf(t *testing.T, p string) (int, int) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// TestExtractDropsSetIDBits extracts a tenant's set-ID files and
// directory: by default none keeps a set-ID bit and all belong to the
// caller, so a copy out run as root never makes a set-user-ID root file
// from a tenant's content (docs/workspaces.md, Copying files).
func TestExtractDropsSetIDBits(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "dest")
	if err := Extract(archive(t, setIDArchive(t)...), "b", dest, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{
		".":            fs.ModeDir | 0o755,
		"suid":         0o755,
		"both":         0o755,
		"shared":       fs.ModeDir | 0o777,
		"shared/inner": 0o711,
	}
	for p, mode := range want {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v (no set-ID bit)", p, fi.Mode(), mode)
		}
		if uid, gid := ownerOf(t, filepath.Join(dest, p)); uid != os.Geteuid() || gid != os.Getegid() {
			t.Errorf("%s: owner %d:%d, want the caller's %d:%d", p, uid, gid, os.Geteuid(), os.Getegid())
		}
	}
}

// TestExtractSameOwner keeps the archive's owners and, with them, the
// set-ID bits, as GNU tar's --same-owner does; it needs root.
func TestExtractSameOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		err := Extract(archive(t, setIDArchive(t)...), "b", filepath.Join(t.TempDir(), "d"), ExtractOptions{SameOwner: true})
		if err == nil {
			t.Fatal("SameOwner as a non-root user: no error")
		}
		testutil.SkipUnlessStrict(t, "the rest needs root (chown to another user)")
		return
	}
	dest := filepath.Join(t.TempDir(), "dest")
	if err := Extract(archive(t, setIDArchive(t)...), "b", dest, ExtractOptions{SameOwner: true}); err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{
		".":            fs.ModeDir | 0o755,
		"suid":         fs.ModeSetuid | 0o755,
		"both":         fs.ModeSetuid | fs.ModeSetgid | 0o755,
		"shared":       fs.ModeDir | fs.ModeSetgid | 0o777,
		"shared/inner": fs.ModeSetuid | 0o711,
		"link":         fs.ModeSymlink | 0o777,
	}
	for p, mode := range want {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), mode)
		}
		if uid, gid := ownerOf(t, filepath.Join(dest, p)); uid != 4242 || gid != 4242 {
			t.Errorf("%s: owner %d:%d, want the archive's 4242:4242", p, uid, gid)
		}
	}
}
