package tarcopy

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// member is one entry of a crafted archive.
type member struct {
	name, link, body string
	typ              byte
	mode             int64
	uid, gid         int
}

func archive(t *testing.T, ms ...member) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Linkname: m.link, Typeflag: m.typ, Mode: m.mode, Size: int64(len(m.body)), ModTime: time.Unix(1700000000, 0), Uid: m.uid, Gid: m.gid}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if m.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(m.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

func dir(name string) member        { return member{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, body string) member { return member{name: name, body: body, typ: tar.TypeReg} }
func symlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeSymlink}
}
func hardlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeLink}
}

// TestExtractRefusesHostileArchives gives Extract archives that try to
// write outside the destination, each class of attack on its own. Each
// case asserts the reason of its own check (so that taking the check out
// fails the case even where os.Root would still stop the write) and that
// nothing appeared outside.
func TestExtractRefusesHostileArchives(t *testing.T) {
	tests := map[string]struct {
		// setup prepares dest (an existing directory) given the outside
		// directory's path.
		setup   func(t *testing.T, dest, outside string)
		members func(outside string) []member
		want    error
	}{
		"absolute name": {
			members: func(outside string) []member {
				return []member{dir("b/"), file(filepath.Join(outside, "f"), "x")}
			},
			want: ErrAbsolute,
		},
		"dot-dot name": {
			members: func(string) []member { return []member{dir("b/"), file("b/../../outside/f", "x")} },
			want:    ErrDotDot,
		},
		"dot-dot at the end": {
			members: func(string) []member { return []member{dir("b/"), dir("b/sub/.."), file("b/f", "x")} },
			want:    ErrDotDot,
		},
		"a name not below the copied path": {
			members: func(string) []member { return []member{dir("b/"), file("other/f", "x")} },
			want:    ErrOutsideBase,
		},
		"a file through a symbolic link the archive made, pointing outside": {
			members: func(outside string) []member {
				return []member{dir("b/"), symlink("b/l", outside), file("b/l/f", "x")}
			},
			want: ErrThroughSymlink,
		},
		"a file through a symbolic link the archive made, pointing inside": {
			// os.Root would allow this write (it stays inside); only the
			// symlink check refuses it.
			members: func(string) []member {
				return []member{dir("b/"), dir("b/sub/"), symlink("b/l", "sub"), file("b/l/f", "x")}
			},
			want: ErrThroughSymlink,
		},
		"a directory through a symbolic link the archive made": {
			members: func(outside string) []member {
				return []member{dir("b/"), symlink("b/l", outside), dir("b/l/d/")}
			},
			want: ErrThroughSymlink,
		},
		"a file through a symbolic link already in the destination": {
			setup: func(t *testing.T, dest, outside string) {
				if err := os.Symlink(outside, filepath.Join(dest, "l")); err != nil {
					t.Fatal(err)
				}
			},
			members: func(string) []member { return []member{dir("b/"), file("b/l/f", "x")} },
			want:    ErrThroughSymlink,
		},
		"a hard link to an absolute name": {
			members: func(outside string) []member {
				return []member{dir("b/"), hardlink("b/h", filepath.Join(outside, "secret"))}
			},
			want: ErrAbsolute,
		},
		"a hard link with dot-dot": {
			members: func(string) []member { return []member{dir("b/"), hardlink("b/h", "b/../../outside/secret")} },
			want:    ErrDotDot,
		},
		"a hard link through a symbolic link to outside": {
			members: func(outside string) []member {
				return []member{dir("b/"), symlink("b/l", outside), hardlink("b/h", "b/l/secret")}
			},
			want: ErrHardLink,
		},
		"a hard link to a file the archive did not write": {
			setup: func(t *testing.T, dest, _ string) {
				if err := os.WriteFile(filepath.Join(dest, "mine"), []byte("local"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			members: func(string) []member { return []member{dir("b/"), hardlink("b/h", "b/mine")} },
			want:    ErrHardLink,
		},
		"a character device": {
			members: func(string) []member { return []member{dir("b/"), {name: "b/null", typ: tar.TypeChar}} },
			want:    ErrDevice,
		},
		"a block device": {
			members: func(string) []member { return []member{dir("b/"), {name: "b/sda", typ: tar.TypeBlock}} },
			want:    ErrDevice,
		},
		"a named pipe": {
			members: func(string) []member { return []member{dir("b/"), {name: "b/p", typ: tar.TypeFifo}} },
			want:    ErrSpecial,
		},
		"a file where the archive made a directory": {
			members: func(string) []member { return []member{dir("b/"), dir("b/d/"), file("b/d", "x")} },
			want:    ErrIsDir,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			top := t.TempDir()
			dest, outside := filepath.Join(top, "dest"), filepath.Join(top, "outside")
			for _, d := range []string{dest, outside} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, dest, outside)
			}
			err := Extract(archive(t, tc.members(outside)...), "b", dest, ExtractOptions{})
			var me *MemberError
			if !errors.As(err, &me) || !errors.Is(err, tc.want) {
				t.Fatalf("Extract = %v, want a *MemberError of %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "archive member") {
				t.Errorf("the error %q does not name the member", err)
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 1 {
				t.Errorf("outside holds %d entries after the extraction, want only its secret", len(entries))
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
				t.Errorf("outside/secret holds %q", b)
			}
			if fi, err := os.Lstat(filepath.Join(outside, "f")); err == nil {
				t.Errorf("outside/f was written: %v", fi.Mode())
			}
		})
	}
}

// TestExtractReplacesALinkNotItsTarget: a file member whose name is a
// symbolic link in the destination replaces the link; the file the link
// pointed to is untouched.
func TestExtractReplacesALinkNotItsTarget(t *testing.T) {
	top := t.TempDir()
	dest := filepath.Join(top, "dest")
	target := filepath.Join(top, "target")
	if err := os.Mkdir(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dest, "l")); err != nil {
		t.Fatal(err)
	}
	if err := Extract(archive(t, dir("b/"), file("b/l", "new")), "b", dest, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("the link's target now holds %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dest, "l"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("dest/l: %v, %v; want a regular file", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "l")); string(b) != "new" {
		t.Errorf("dest/l holds %q, want new", b)
	}
}

// TestExtractSingleFile covers a file's destination: the path itself, or
// inside it when it is an existing directory; a second member is refused.
func TestExtractSingleFile(t *testing.T) {
	top := t.TempDir()
	if err := Extract(archive(t, file("f.txt", "one")), "f.txt", filepath.Join(top, "renamed"), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(top, "renamed")); err != nil || string(b) != "one" {
		t.Errorf("renamed: %q, %v", b, err)
	}
	if err := Extract(archive(t, file("f.txt", "two")), "f.txt", top, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(top, "f.txt")); err != nil || string(b) != "two" {
		t.Errorf("f.txt in the directory: %q, %v", b, err)
	}
	err := Extract(archive(t, file("f.txt", "x"), file("f.txt/../evil", "y")), "f.txt", filepath.Join(top, "third"), ExtractOptions{})
	var me *MemberError
	if !errors.As(err, &me) {
		t.Errorf("a member after the single file: %v, want a *MemberError", err)
	}
}

// TestWriteExtractRoundTrip writes a tree with Write and extracts it:
// modes (also of a read-only directory with contents and a sticky one),
// symbolic links as links, empty directories and times survive.
func TestWriteExtractRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	mtime := time.Unix(1600000000, 0)
	mk := func(p string, mode fs.FileMode, body string) {
		t.Helper()
		p = filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	mk("a.txt", 0o640, "a")
	mk("bin/run", 0o755, "#!/bin/sh\n")
	mk("ro/inside", 0o444, "r")
	mk("suid", fs.ModeSetuid|0o755, "s")
	for _, d := range []string{"empty", "empty/deeper"} {
		if err := os.Mkdir(filepath.Join(src, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "rel-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nowhere/at/all", filepath.Join(src, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "tmp"), fs.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(src, "ro"), 0o755) })
	if err := os.Chmod(src, 0o711); err != nil {
		t.Fatal(err)
	}

	var b bytes.Buffer
	if err := Write(&b, src); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "dest")
	if err := Extract(&b, Placeholder, dest, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dest, "ro"), 0o755) })

	want := map[string]fs.FileMode{
		".":            fs.ModeDir | 0o711,
		"a.txt":        0o640,
		"bin":          fs.ModeDir | 0o755,
		"bin/run":      0o755,
		"ro":           fs.ModeDir | 0o555,
		"ro/inside":    0o444,
		"suid":         0o755, // set-user-ID is not copied
		"empty":        fs.ModeDir | 0o750,
		"empty/deeper": fs.ModeDir | 0o750,
		"rel-link":     fs.ModeSymlink,
		"dangling":     fs.ModeSymlink,
		"tmp":          fs.ModeDir | fs.ModeSticky | 0o777,
	}
	for p, mode := range want {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		got := fi.Mode()
		if mode&fs.ModeSymlink != 0 {
			got &= fs.ModeType
		}
		if got != mode {
			t.Errorf("%s: mode %v, want %v", p, got, mode)
		}
	}
	if l, _ := os.Readlink(filepath.Join(dest, "rel-link")); l != "a.txt" {
		t.Errorf("rel-link -> %q", l)
	}
	if l, _ := os.Readlink(filepath.Join(dest, "dangling")); l != "/nowhere/at/all" {
		t.Errorf("dangling -> %q", l)
	}
	if fi, err := os.Stat(filepath.Join(dest, "a.txt")); err != nil || !fi.ModTime().Equal(mtime) {
		t.Errorf("a.txt's time: %v, %v; want %v", fi, err, mtime)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "ro/inside")); string(b) != "r" {
		t.Errorf("ro/inside holds %q", b)
	}
	entries, err := os.ReadDir(filepath.Join(dest, "empty/deeper"))
	if err != nil || len(entries) != 0 {
		t.Errorf("empty/deeper: %v, %v", entries, err)
	}
}

// TestExtractMergesIntoAnExistingDirectory: an existing destination
// keeps its own mode and its other files.
func TestExtractMergesIntoAnExistingDirectory(t *testing.T) {
	dest := t.TempDir()
	if err := os.Chmod(dest, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dest, "old"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := dir("b/")
	m.mode = 0o777
	if err := Extract(archive(t, m, file("b/new", "new")), "b", dest, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"old", "new"} {
		if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
			t.Error(err)
		}
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o700 {
		t.Errorf("the existing destination's mode became %v", fi.Mode())
	}
}

// TestWriteRefusesSpecialFiles: a named pipe in the tree is an error
// naming it.
func TestWriteRefusesSpecialFiles(t *testing.T) {
	src := t.TempDir()
	p := filepath.Join(src, "pipe")
	if err := mkfifo(p); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	err := Write(new(bytes.Buffer), src)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "named pipe") {
		t.Errorf("Write = %v, want an error naming %s as a named pipe", err, p)
	}
}
