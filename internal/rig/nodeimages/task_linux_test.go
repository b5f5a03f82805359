//go:build linux

package nodeimages

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	imagestore "github.com/bashtask/bashtask-operator/executor/image"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// needTaskSmallFiles skips t, or fails it under BASHTASK_STRICT=1, when
// the machine lacks Debian's bash-static or busybox-static (make
// test-packages installs them) or the store cannot run (not root).
func needTaskSmallFiles(t *testing.T) {
	t.Helper()
	for _, f := range []string{HostBashStatic, HostBusybox} {
		if _, err := os.Stat(f); err != nil {
			testutil.SkipUnlessStrictf(t, "%s is missing (make test-packages installs bash-static and busybox-static): %v", f, err)
		}
	}
	if os.Geteuid() != 0 {
		testutil.SkipUnlessStrict(t, "the image store needs root (layers' owners and whiteouts)")
	}
}

// TestTaskSmallThroughRegistry builds task-small, pushes it to a registry
// on the machine, pulls it back into an empty image store by tag and
// finds bash at /bin/bash, BusyBox's applets linked to /bin/busybox, root
// in /etc/passwd and a sticky /tmp in its layer, and the image's PATH.
func TestTaskSmallThroughRegistry(t *testing.T) {
	needTaskSmallFiles(t)
	imgs, err := Build(context.Background(), testOptions(t, TaskSmall))
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Kind != TaskSmall || imgs[0].Ref != "localhost/bashtask/task-small:test" {
		t.Fatalf("Build = %+v, want task-small alone as localhost/bashtask/task-small:test", imgs)
	}
	reg := registry.StartForTest(t)
	if _, err := reg.PushArchive(context.Background(), imgs[0].Archive, imgs[0].Ref); err != nil {
		t.Fatal(err)
	}
	store, err := imagestore.Open(filepath.Join(t.TempDir(), "store"), imagestore.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	im, err := store.Pull(context.Background(), reg.Ref("bashtask/task-small", "test"), imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	if len(im.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(im.Layers))
	}
	checkTaskSmallLayer(t, im.Layers[0])
	if !strings.Contains(strings.Join(im.Config.Env, " "), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("Env = %q, want Debian's PATH", im.Config.Env)
	}
	if im.Size > 8<<20 {
		t.Errorf("unpacked size %d bytes, want a few MiB", im.Size)
	}
}

// checkTaskSmallLayer checks the unpacked layer directory dir.
func checkTaskSmallLayer(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, "bin", "bash"))
	if err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("/bin/bash: %v, mode %v; want an executable", err, fi.Mode())
	}
	for _, applet := range []string{"bin/sh", "bin/ls", "bin/cat", "usr/bin/env", "bin/sed"} {
		target, err := os.Readlink(filepath.Join(dir, applet))
		if err != nil || target != "/bin/busybox" {
			t.Errorf("/%s: link to %q (%v), want /bin/busybox", applet, target, err)
		}
	}
	passwd, err := os.ReadFile(filepath.Join(dir, "etc", "passwd"))
	if err != nil || !strings.HasPrefix(string(passwd), "root:x:0:0:") {
		t.Errorf("/etc/passwd = %q (%v), want root's entry", passwd, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp: %v (%v), want drwxrwxrwt", fi.Mode(), err)
	}
}

// TestBusyboxApplets lists the applets of the machine's busybox: bash is
// never among them, nor /linuxrc (not in a directory of PATH), and the
// shell's link is.
func TestBusyboxApplets(t *testing.T) {
	needTaskSmallFiles(t)
	applets, err := busyboxApplets(HostBusybox)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range applets {
		if strings.HasSuffix(a, "/bash") || !slices.Contains(appletDirs(), filepath.Dir(a)) {
			t.Errorf("applet %q: want no bash, and each in one of %q", a, appletDirs())
		}
	}
	if !strings.Contains(strings.Join(applets, " "), "bin/sh ") {
		t.Errorf("no bin/sh among %q", applets)
	}
}

// TestTaskKindsOnlyWhenListed checks that Build's default is the node's
// images and that the task images are built when listed, after them.
func TestTaskKindsOnlyWhenListed(t *testing.T) {
	_, kinds, err := Options{Tag: "t"}.complete()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kinds, Kinds()) {
		t.Errorf("default kinds %v, want %v", kinds, Kinds())
	}
	_, kinds, err = Options{Tag: "t", Only: []Kind{Task, Pause, TaskSmall}}.complete()
	if err != nil {
		t.Fatal(err)
	}
	if want := []Kind{Pause, TaskSmall, Task}; !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
}
