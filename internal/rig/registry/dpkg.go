package registry

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// dpkgImagePrograms are the node's programs a dpkg image holds, with the
// libraries they load: dpkg and apt-get and what they run.
var dpkgImagePrograms = []string{
	"/usr/bin/dpkg", "/usr/bin/dpkg-deb", "/usr/bin/dpkg-query", "/usr/bin/dpkg-split", "/usr/bin/dpkg-divert",
	"/usr/bin/dpkg-trigger", "/usr/bin/dpkg-maintscript-helper", "/usr/bin/apt-get", "/usr/bin/apt-config",
	"/usr/lib/apt/methods/file", "/usr/lib/apt/methods/copy", "/usr/lib/apt/methods/store",
	"/usr/bin/tar", "/usr/sbin/ldconfig", "/usr/sbin/start-stop-daemon",
}

// dpkgImageApplets are the busybox applets of a dpkg image.
var dpkgImageApplets = []string{"sh", "cat", "ls", "id", "grep", "stat", "sleep", "mkdir", "printf", "echo", "rm",
	"diff", "mount", "unshare", "chroot", "touch", "test", "true", "head", "tr", "sed", "mv", "chmod", "chown", "cp"}

// libDirs are where buildDpkgImage looks for a program's libraries.
var libDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"}

// DpkgTreeForTest makes layer, a new directory, the tree of a one-layer
// image with Debian's dpkg and apt-get copied from the machine's own
// (usr-merged: /bin, /sbin, /lib and /lib64 link into /usr), bash-static
// as /bin/bash, BusyBox's applets, an empty dpkg database, and apt's
// partial directories owned by uid 100, mode 0700, as Debian's _apt owns
// them. It must run as root (the owners); it skips t without dpkg,
// apt-get or the static programs (fails it under BASHTASK_STRICT).
func DpkgTreeForTest(t testing.TB, layer string) {
	t.Helper()
	for _, p := range append([]string{hostBashStatic, hostBusybox}, dpkgImagePrograms...) {
		if _, err := os.Stat(p); err != nil {
			testutil.SkipUnlessStrictf(t, "%s missing (a Debian machine has dpkg and apt; make test-packages installs the static programs): %v", p, err)
		}
	}
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc/apt/apt.conf.d", "etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/dpkg/dpkg.cfg.d", "usr/share/dpkg",
		"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/lib/dpkg/alternatives",
		"var/lib/apt/lists", "var/cache/apt/archives", "var/log/apt", "tmp", "root"} {
		mkdirForTest(t, filepath.Join(layer, d), 0o755)
	}
	if err := os.Chmod(filepath.Join(layer, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(layer, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"var/lib/apt/lists/partial", "var/cache/apt/archives/partial"} {
		mkdirForTest(t, filepath.Join(layer, d), 0o700)
		if err := os.Chown(filepath.Join(layer, d), 100, 0); err != nil {
			t.Fatal(err)
		}
	}
	copyFileForTest(t, hostBashStatic, filepath.Join(layer, "usr/bin/bash"), 0o755)
	copyFileForTest(t, hostBusybox, filepath.Join(layer, "usr/bin/busybox"), 0o755)
	for _, a := range dpkgImageApplets {
		if err := os.Symlink("busybox", filepath.Join(layer, "usr/bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"cputable", "ostable", "tupletable", "abitable"} {
		copyFileForTest(t, "/usr/share/dpkg/"+table, filepath.Join(layer, "usr/share/dpkg", table), 0o644)
	}
	copied := map[string]bool{}
	for _, p := range dpkgImagePrograms {
		copyWithLibraries(t, layer, p, copied)
	}
	for name, content := range map[string]string{
		"etc/passwd":               "root:x:0:0:root:/root:/bin/bash\n_apt:x:100:65534::/nonexistent:/usr/sbin/nologin\n",
		"etc/group":                "root:x:0:\n",
		"etc/os-release":           "ID=bashtask-dpkg-image\n",
		"etc/apt/sources.list":     "",
		"var/lib/dpkg/status":      "",
		"var/lib/dpkg/available":   "",
		"var/lib/dpkg/arch-native": "",
	} {
		if err := os.WriteFile(filepath.Join(layer, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// copyWithLibraries copies the node's program p into layer at its path
// (/lib64 and the like taken as their /usr paths), with its ELF
// interpreter and the libraries it needs, found in libDirs, once each.
func copyWithLibraries(t testing.TB, layer, p string, copied map[string]bool) {
	t.Helper()
	if copied[p] {
		return
	}
	copied[p] = true
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(layer, usrMerged(p))
	mkdirForTest(t, filepath.Dir(dst), 0o755)
	copyFileForTest(t, real, dst, 0o755)
	f, err := elf.Open(real)
	if err != nil {
		return // a script (dpkg-maintscript-helper)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err == nil {
				copyWithLibraries(t, layer, strings.TrimRight(string(b), "\x00"), copied)
			}
		}
	}
	libs, _ := f.ImportedLibraries()
	for _, lib := range libs {
		found := ""
		for _, d := range libDirs {
			if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
				found = filepath.Join(d, lib)
				break
			}
		}
		if found == "" {
			t.Fatalf("library %s of %s not found in %v", lib, p, libDirs)
		}
		copyWithLibraries(t, layer, found, copied)
	}
}

// usrMerged is p with /bin, /sbin, /lib and /lib64 taken as their /usr
// paths, as in a usr-merged image.
func usrMerged(p string) string {
	for _, d := range []string{"/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(p, d) {
			return "/usr" + p
		}
	}
	return p
}

// mkdirForTest makes p and its parents with mode, chmod'ed past the
// umask.
func mkdirForTest(t testing.TB, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// copyFileForTest copies the regular file from to to with mode.
func copyFileForTest(t testing.TB, from, to string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode); err != nil {
		t.Fatal(err)
	}
}

// DirImageForTest is an image for linux and the machine's architecture
// whose one layer holds the tree dir: directories, regular files and
// symbolic links with their modes and numeric owners.
func DirImageForTest(t testing.TB, dir string) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name, h.Uname, h.Gname = filepath.ToSlash(rel), "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}
