//go:build linux

package executor

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// countingMkfs is an mkfs.ext4 that appends a line to the returned file
// on each run.
func countingMkfs(t *testing.T) (script, count string) {
	t.Helper()
	real, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		testutil.SkipUnlessStrictf(t, "no mkfs.ext4: %v", err)
	}
	dir := t.TempDir()
	script, count = filepath.Join(dir, "mkfs.ext4"), filepath.Join(dir, "runs")
	body := "#!/bin/sh\necho run >> " + count + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, count
}

func superField(t *testing.T, image string, off int) []byte {
	t.Helper()
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 16)
	if _, err := f.ReadAt(b, ext4SuperOffset+int64(off)); err != nil {
		t.Fatal(err)
	}
	return b
}

// The file systems of the default size are copies of one template, not
// made by mkfs.ext4 one by one: after several, mkfs.ext4 ran once. Each
// is as fresh as a new one: empty, its own UUID and hash seed, nothing
// an earlier one held.
func TestDiskQuotaTemplate(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testutil.SkipUnlessStrictf(t, "no loop devices: %v", err)
	}
	mkfs, count := countingMkfs(t)
	images, root := t.TempDir(), t.TempDir()
	q, err := newDiskQuota(Config{DiskQuotaBytes: 64 << 20, DiskImageDir: images, mkfs: mkfs}, root)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	if q.template == "" {
		t.Fatal("no template made")
	}
	seen := map[string]bool{string(superField(t, q.template, ext4UUIDOffset)): true, string(superField(t, q.template, ext4HashSeedOffset)): true}
	for i := range 5 {
		fs, err := q.take(0)
		if err != nil {
			t.Fatal(err)
		}
		if entries, err := os.ReadDir(fs.dir); err != nil || len(entries) != 0 {
			t.Errorf("file system %d: %d entries (%v), want an empty directory", i, len(entries), err)
		}
		for _, off := range []int{ext4UUIDOffset, ext4HashSeedOffset} {
			v := string(superField(t, fs.image, off))
			if seen[v] {
				t.Errorf("file system %d: the superblock's field at %#x %x is the template's or an earlier one's", i, off, v)
			}
			seen[v] = true
		}
		if err := os.WriteFile(filepath.Join(fs.dir, "left"), []byte("secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := fs.remove(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the pool refilled", func() bool { return len(q.pool) == diskPoolSize })
	if b, _ := os.ReadFile(count); strings.Count(string(b), "run") != 1 {
		t.Errorf("mkfs.ext4 ran %d times for 5 file systems and the pool's, want once (the template)", strings.Count(string(b), "run"))
	}
}

// A copy of the template with its UUID changed is a clean file system
// to e2fsck.
func TestDiskQuotaTemplateCopyChecks(t *testing.T) {
	t.Parallel()
	e2fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		testutil.SkipUnlessStrictf(t, "no e2fsck: %v", err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testutil.SkipUnlessStrictf(t, "no mkfs.ext4: %v", err)
	}
	dir := t.TempDir()
	q := &diskQuota{imageDir: dir, defBytes: 64 << 20, inodes: 4096, mkfsPath: "mkfs.ext4"}
	if q.mkfsPath, err = exec.LookPath("mkfs.ext4"); err != nil {
		t.Fatal(err)
	}
	if err := q.makeTemplate(); err != nil || q.template == "" {
		t.Fatalf("makeTemplate: %v (template %q)", err, q.template)
	}
	img, err := q.newImage(filepath.Join(dir, "copy.img"), q.defBytes)
	if err != nil {
		t.Fatal(err)
	}
	img.Close()
	out, err := exec.Command(e2fsck, "-fn", img.Name()).CombinedOutput()
	if err != nil {
		t.Errorf("e2fsck -fn of a copy: %v\n%s", err, out)
	}
	if bytes.Equal(superField(t, img.Name(), ext4UUIDOffset), superField(t, q.template, ext4UUIDOffset)) {
		t.Error("the copy has the template's UUID")
	}
}
