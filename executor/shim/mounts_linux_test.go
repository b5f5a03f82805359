//go:build linux

package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// /etc/resolv.conf may be a link into /run (systemd-resolved's
// stub-resolv.conf): the file it leads to is what the mount step binds
// back into the task's own /run; a link elsewhere, or to nothing, is left.
func TestUnderRun(t *testing.T) {
	dir := fmt.Sprintf("/run/bashtask-test-%d", os.Getpid())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("a directory under /run: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	target := filepath.Join(dir, "stub-resolv.conf")
	if err := os.WriteFile(target, []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := t.TempDir()
	for name, to := range map[string]string{"run": target, "etc": "/etc/hostname", "gone": dir + "/absent"} {
		if err := os.Symlink(to, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"run": target, "etc": "", "gone": ""} {
		if got := underRun(filepath.Join(links, name)); got != want {
			t.Errorf("underRun of a link to %s: %q, want %q", name, got, want)
		}
	}
}
