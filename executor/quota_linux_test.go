//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// quotaExecutor is a tenant-level executor whose fresh working
// directories get a disk quota of size bytes and inodes inodes, with its
// own image directory; it skips where the node has no loop devices.
func quotaExecutor(t *testing.T, size, capBytes, inodes int64) (*Executor, string) {
	t.Helper()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	images := t.TempDir()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) {
		c.Isolation = IsolationTenant
		c.DiskQuotaBytes, c.DiskQuotaCapBytes, c.DiskQuotaInodes, c.DiskImageDir = size, capBytes, inodes, images
	})
	if !ex.Capabilities().DiskQuota {
		t.Fatalf("no disk quota on a node with loop devices: %s", ex.quotaReason)
	}
	return ex, images
}

// ourLoopMounts lists the mount points of images in dir.
func ourLoopMounts(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := loopMounts()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		b, err := os.ReadFile("/sys/block/" + filepath.Base(m.dev) + "/loop/backing_file")
		if err == nil && filepath.Dir(strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")) == dir {
			out = append(out, m.point)
		}
	}
	return out
}

// A task that writes past its working directory's quota gets ENOSPC in
// that task alone: a second task writing at the same time, and a third
// task's spill file on the node's disk, keep growing past the first
// task's limit. The inode limit fails the same way, and a task's
// working directory file system is gone with it.
func TestDiskQuota(t *testing.T) {
	t.Parallel()
	ex, images := quotaExecutor(t, 64<<20, 128<<20, 2000)

	// The first task waits for the test to have looked at its working
	// directory: on a busy machine it could otherwise end, and its file
	// system go, before the test looks.
	full := testSpec(t, `until [ -e looked ]; do sleep 0.05; done; rm looked
dd if=/dev/zero of=f bs=1M count=100 2>&1; echo rc=$?; df -B1 --output=size . | tail -1`)
	full.User = &User{UID: 2000141, GID: 2000141}
	other := testSpec(t, `dd if=/dev/zero of=g bs=1M count=50 2>/dev/null; echo rc=$? bytes=$(stat -c %s g)`)
	other.User = &User{UID: 2000142, GID: 2000142}
	spill := testSpec(t, `head -c 100M /dev/zero`)
	spill.User = &User{UID: 2000143, GID: 2000143}
	spill.SpillLimitBytes = 200 << 20
	var tasks []*Task
	for _, s := range []Spec{full, other, spill} {
		task, err := ex.Start(s)
		if err != nil {
			t.Fatalf("Start(%q): %v", s.Command, err)
		}
		tasks = append(tasks, task)
	}
	wd := tasks[0].WorkingDir()
	if !slices.Contains(ourLoopMounts(t, images), wd) {
		t.Errorf("working directory %s is not a mount of an image in %s", wd, images)
	}
	if err := os.WriteFile(filepath.Join(wd, "looked"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	resFull, resOther, resSpill := wait(t, tasks[0]), wait(t, tasks[1]), wait(t, tasks[2])
	if !strings.Contains(resFull.Stdout.Tail, "No space left on device") || strings.Contains(resFull.Stdout.Tail, "rc=0") {
		t.Errorf("100 MiB into a 64 MiB working directory: %q, want dd failing with ENOSPC", resFull.Stdout.Tail)
	}
	if size, err := strconv.ParseInt(strings.TrimSpace(resFull.Stdout.Tail[strings.LastIndex(strings.TrimSpace(resFull.Stdout.Tail), "\n")+1:]), 10, 64); err != nil || size > 64<<20 || size < 48<<20 {
		t.Errorf("df of the working directory: %d (%v), want at most 64 MiB and not much less", size, err)
	}
	if want := fmt.Sprintf("rc=0 bytes=%d\n", 50<<20); resOther.Stdout.Tail != want {
		t.Errorf("the second task: %q, want %q", resOther.Stdout.Tail, want)
	}
	if resSpill.Reason != ReasonSucceeded || resSpill.Stdout.SpillBytes != 100<<20 {
		t.Errorf("the third task: %s, spill %d bytes, want Succeeded with 100 MiB spilled", resSpill.Reason, resSpill.Stdout.SpillBytes)
	}
	for _, res := range []Result{resFull, resOther, resSpill} {
		if slices.Contains(res.LimitsNotEnforced, LimitEphemeralStorage) {
			t.Errorf("LimitsNotEnforced %v on a node with loop devices", res.LimitsNotEnforced)
		}
	}
	// Closed to the task's UID at its end, unmounted and removed soon after.
	if fi, err := os.Stat(wd); err == nil && (fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != 0) {
		t.Errorf("working directory %s after the end: mode %v, uid %d, want root's, 0700", wd, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	waitFor(t, 30*time.Second, "the working directory's file system unmounted and removed", func() bool {
		_, err := os.Stat(wd)
		return errors.Is(err, os.ErrNotExist) && !slices.Contains(ourLoopMounts(t, images), wd)
	})

	// Inodes: 2000 in all, some of them ext4's own.
	files := testSpec(t, `for i in $(seq 3000); do : > f$i 2>/dev/null || { echo failed=$i; exit 3; }; done`)
	files.User = &User{UID: 2000144, GID: 2000144}
	res := run(t, ex, files)
	if res.ExitCode != 3 || !strings.HasPrefix(res.Stdout.Tail, "failed=") {
		t.Errorf("3000 empty files with 2000 inodes: exit %d, %q, want the creation failing", res.ExitCode, res.Stdout.Tail)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(res.Stdout.Tail, "failed="))); n < 1900 || n > 2001 {
		t.Errorf("creation failed at file %d, want about 2000", n)
	}

	// A smaller size than the default, and the cap.
	small := testSpec(t, `df -B1 --output=size . | tail -1`)
	small.WorkingDir = ""
	small.User = &User{UID: 2000145, GID: 2000145}
	small.Limits.DiskBytes = 40 << 20
	task, err := ex.Start(small)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	res = wait(t, task)
	if size, err := strconv.ParseInt(strings.TrimSpace(res.Stdout.Tail), 10, 64); err != nil || size > 40<<20 || size < 30<<20 {
		t.Errorf("df with a 40 MiB spec: %q (%v), want at most 40 MiB", res.Stdout.Tail, err)
	}
	over := testSpec(t, `true`)
	over.User = &User{UID: 2000146, GID: 2000146}
	over.Limits.DiskBytes = 129 << 20
	if _, err := ex.Start(over); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "spec.resources.ephemeralStorage") || !strings.Contains(err.Error(), strconv.Itoa(128<<20)) {
		t.Errorf("over the cap: %v, want ErrInvalidSpec naming the field and the cap", err)
	}
	waitFor(t, 30*time.Second, "no more images than the template, the pool's and the one its filler holds", func() bool {
		entries, _ := os.ReadDir(images)
		return len(entries) <= diskPoolSize+2
	})
}

// What an executor that died left (a mounted image, a loose image) is
// gone after SweepDiskImages, which New runs.
func TestSweepDiskImages(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	images, root := t.TempDir(), t.TempDir()
	q, err := newDiskQuota(Config{DiskQuotaBytes: 32 << 20, DiskImageDir: images}, root)
	if err != nil {
		t.Fatal(err)
	}
	// As if the process died: the filler stops, its file systems stay.
	close(q.stop)
	q.wg.Wait()
	if len(ourLoopMounts(t, images)) == 0 {
		t.Fatal("no file system mounted from the image directory")
	}
	if err := os.WriteFile(filepath.Join(images, "loose.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SweepDiskImages(images); err != nil {
		t.Fatal(err)
	}
	if m := ourLoopMounts(t, images); len(m) != 0 {
		t.Errorf("still mounted after the sweep: %v", m)
	}
	if entries, _ := os.ReadDir(images); len(entries) != 0 {
		t.Errorf("%d files left in the image directory", len(entries))
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("%d mount points left under the work root", len(entries))
	}
}

// A node without loop devices runs tasks without the quota, and says so:
// no disk-quota capability, ephemeral-storage in every task's
// LimitsNotEnforced.
func TestDiskQuotaNotEnforced(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) {
		c.Isolation = IsolationTenant
		c.DiskQuotaBytes, c.DiskImageDir = 64<<20, t.TempDir()
		c.loopControl = "/does/not/exist/loop-control"
	})
	if ex.Capabilities().DiskQuota || slices.Contains(ex.Capabilities().Names(), "disk-quota") || !strings.Contains(ex.quotaReason, "loop") {
		t.Fatalf("capabilities %v (reason %q), want no disk-quota naming the loop devices", ex.Capabilities().Names(), ex.quotaReason)
	}
	spec := testSpec(t, `echo hi > f && cat f`)
	spec.User = &User{UID: 2000147, GID: 2000147}
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded || !slices.Contains(res.LimitsNotEnforced, LimitEphemeralStorage) {
		t.Errorf("%s %q, LimitsNotEnforced %v: want Succeeded naming %s", res.Reason, res.Message, res.LimitsNotEnforced, LimitEphemeralStorage)
	}
}
