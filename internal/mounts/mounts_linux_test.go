package mounts

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:                 `/plain`,
		`/with\040space`:         `/with space`,
		`/tab\011and\012nl`:      "/tab\tand\nnl",
		`/back\134slash`:         `/back\slash`,
		`/not\0octal\9`:          `/not\0octal\9`,
		`/trailing\04`:           `/trailing\04`,
		`/two\040\040spaces\040`: `/two  spaces `,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	for _, tc := range []struct {
		point, dir string
		want       bool
	}{
		{"/a/b", "/a/b", true}, {"/a/b/c", "/a/b", true}, {"/a/b/c", "/a/b/", true},
		{"/a/bc", "/a/b", false}, {"/a", "/a/b", false},
	} {
		if got := Under(tc.point, tc.dir); got != tc.want {
			t.Errorf("Under(%q, %q) = %v, want %v", tc.point, tc.dir, got, tc.want)
		}
	}
}

// Two tmpfs mounts, one on top of a directory inside the other, go in one
// call, the inner first; nothing else is touched.
func TestUnmountWhere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	outer := filepath.Join(dir, "outer with space")
	if err := os.Mkdir(outer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", outer, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount tmpfs here: %v", err)
	}
	inner := filepath.Join(outer, "inner")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", inner, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(inner, unix.MNT_DETACH); _ = unix.Unmount(outer, unix.MNT_DETACH) })
	if err := UnmountWhere(func(p string) bool { return Under(p, outer) }); err != nil {
		t.Fatal(err)
	}
	points, err := Points()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range points {
		if Under(p, outer) {
			t.Errorf("%s still mounted", p)
		}
	}
}
