//go:build linux

package executor

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// Test images, built from Debian's bash-static and busybox-static
// (hack/test-packages.sh installs them; make test-unit runs it).
const (
	staticBash    = "/bin/bash-static"
	staticBusybox = "/bin/busybox"
)

// testImage is an image of two layers in overlayfs's on-disk format, the
// topmost first: the base layer with bash, busybox and its applets,
// /etc/passwd of its own, /etc/os-release, /etc/gone, a set-user-ID root
// copy of bash and a directory /srv/shared anyone may write; the top
// layer with a whiteout over /etc/gone and /etc/top-marker.
type testImage struct {
	ref    string
	layers []string
}

// testApplets are the busybox applets of a testImage.
var testApplets = []string{"sh", "cat", "ls", "tr", "grep", "awk", "id", "whoami", "touch", "readlink", "test",
	"echo", "sort", "true", "env", "mkdir", "rm", "stat", "sleep", "chmod", "dd"}

func (i testImage) root() *Root {
	return &Root{Image: i.ref, LowerDirs: i.layers}
}

// buildTestImage builds a testImage under a fresh directory others may
// traverse (the shim reaches the layers by their node paths); without
// bash, the base layer has busybox alone.
func buildTestImage(t testing.TB, withBash bool) testImage {
	t.Helper()
	for _, p := range []string{staticBash, staticBusybox} {
		if _, err := os.Stat(p); err != nil {
			testutil.SkipUnlessStrictf(t, "%s missing (hack/test-packages.sh installs it): %v", p, err)
		}
	}
	dir := traversableTempDir(t)
	base, top := filepath.Join(dir, "base"), filepath.Join(dir, "top")
	for _, d := range []string{"bin", "etc", "usr/local/bin", "srv/shared", "tmp"} {
		mkdirAll(t, filepath.Join(base, d), 0o755)
	}
	mustChmod(t, filepath.Join(base, "srv/shared"), 0o1777)
	mustChmod(t, filepath.Join(base, "tmp"), 0o1777)
	copyFile(t, staticBusybox, filepath.Join(base, "bin/busybox"), 0o755)
	// The applets the tests run (busybox --list would be a child of this
	// process, whose reaper may take its status first).
	for _, applet := range testApplets {
		if err := os.Symlink("busybox", filepath.Join(base, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	if withBash {
		copyFile(t, staticBash, filepath.Join(base, "bin/bash"), 0o755)
		copyFile(t, staticBash, filepath.Join(base, "bin/suid-bash"), 0o755)
		mustChmod(t, filepath.Join(base, "bin/suid-bash"), 0o4755)
	}
	for name, content := range map[string]string{
		"etc/passwd":     "root:x:0:0:root:/root:/bin/sh\nimageuser:x:1000:1000::/home/imageuser:/bin/sh\n",
		"etc/group":      "root:x:0:\nimageuser:x:1000:\n",
		"etc/os-release": "ID=bashtask-test-image\n",
		"etc/gone":       "deleted by the top layer\n",
		"etc/base-only":  "base\n",
	} {
		writeFile(t, filepath.Join(base, name), content)
	}
	mkdirAll(t, filepath.Join(top, "etc"), 0o755)
	writeFile(t, filepath.Join(top, "etc/top-marker"), "top\n")
	// A whiteout: a character device 0/0 hides the lower file.
	if err := unix.Mknod(filepath.Join(top, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatalf("making a whiteout: %v", err)
	}
	return testImage{ref: "test.local/busybox-bash:1", layers: []string{top, base}}
}

func mkdirAll(t testing.TB, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mustChmod(t testing.TB, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// imageView is a command printing what a task sees of its root, one
// name=value a line.
var imageView = strings.Join([]string{
	`echo exe=$(readlink /proc/$$/exe)`,
	`echo os=$(cat /etc/os-release)`,
	`echo base=$(cat /etc/base-only) top=$(cat /etc/top-marker)`,
	`test -e /etc/gone && echo gone=present || echo gone=absent`,
	`test -e /etc/debian_version && echo node=visible || echo node=hidden`,
	`echo top-level=$(ls / | tr '\n' ' ')`,
	`echo whoami=$(whoami) passwd=$(grep -c imageuser /etc/passwd)`,
	`touch "$HOME/f" && echo homewrite=ok`,
	`echo euid=$(/bin/suid-bash -p -c 'echo $EUID') uid=$(id -u)`,
	`echo rootmount=$(awk '$5 == "/" {print $6}' /proc/self/mountinfo)`,
	`test -e /proc/1 && echo pid1=visible || echo pid1=hidden`,
	`echo mounts=$(awk '{print $5}' /proc/self/mountinfo | sort | tr '\n' ' ')`,
	`echo nnp=$(awk '/^NoNewPrivs/{print $2}' /proc/self/status) seccomp=$(awk '/^Seccomp:/{print $2}' /proc/self/status)`,
	`(echo x > /proc/self/comm) 2>/dev/null && echo procwrite=allowed || echo procwrite=denied`,
	`echo hosts=$(grep -c localhost /etc/hosts)`,
}, "; ")

// A task in an image runs the image's bash with the image's files, the
// top layer's whiteout hiding a file of the base layer, as a named user
// with a writable HOME, nosuid (a set-user-ID root file of the image
// raises nothing), with nothing of the node's root left to reach, and
// under Landlock and seccomp as on the node's root; its private upper
// directory goes with it.
func TestImageRoot(t *testing.T) {
	t.Parallel()
	img := buildTestImage(t, true)
	ex := tenantExecutor(t)
	spec := testSpec(t, imageView)
	spec.User = &User{UID: 2000441, GID: 2000441}
	spec.Root = img.root()
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("%s: %s\n%s\n%s", res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail)
	}
	wants := []string{
		"exe=/bin/bash\n",
		"os=ID=bashtask-test-image\n",
		"base=base top=top\n",
		"gone=absent\n",
		"node=hidden\n",
		"top-level=" + topLevel(ex.workRoot, "bin", "dev", "etc", "home", "proc", "run", "srv", "tmp", "usr") + "\n",
		"whoami=task passwd=1\n",
		"homewrite=ok\n",
		"euid=2000441 uid=2000441\n",
		"pid1=hidden\n",
		"nnp=1 seccomp=2\n",
		"hosts=2\n",
	}
	if shim.LandlockABI() > 0 {
		wants = append(wants, "procwrite=denied\n")
	} else {
		t.Log("no Landlock in this kernel: its probe is not checked")
	}
	for _, want := range wants {
		if !strings.Contains(res.Stdout.Tail, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, res.Stdout.Tail, res.Stderr.Tail)
		}
	}
	checkRootMount(t, res.Stdout.Tail, ex.workRoot)
	if left, _ := filepath.Glob(filepath.Join(ex.workRoot, privateRootPrefix+"*")); len(left) > 0 {
		t.Errorf("the task's private root directories are left: %v", left)
	}
}

// topLevel is what `ls /` lists in an image root of the directories dirs:
// those and the first directory of workRoot, which the task's work
// directory is mounted under at its path, sorted.
func topLevel(workRoot string, dirs ...string) string {
	first, _, _ := strings.Cut(strings.TrimPrefix(workRoot, "/"), "/")
	if !slices.Contains(dirs, first) {
		dirs = append(dirs, first)
	}
	slices.Sort(dirs)
	return strings.Join(dirs, " ")
}

// checkRootMount checks the rootmount= and mounts= lines of imageView:
// the root is nosuid and nodev, and every mount is the task's: its
// system paths, or its work directory at its path under workRoot (the
// executor's, under $TMPDIR, which need not be /tmp).
func checkRootMount(t *testing.T, out, workRoot string) {
	t.Helper()
	for line := range strings.Lines(out) {
		switch {
		case strings.HasPrefix(line, "rootmount="):
			opts := strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "rootmount=")), ",")
			if !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") || !slices.Contains(opts, "rw") {
				t.Errorf("the task's root is mounted %v, want rw, nosuid and nodev", opts)
			}
		case strings.HasPrefix(line, "mounts="):
			for _, m := range strings.Fields(strings.TrimPrefix(line, "mounts=")) {
				ok := m == "/" || m == "/tmp" || m == "/home" || strings.HasPrefix(m, "/proc") ||
					strings.HasPrefix(m, "/dev") || strings.HasPrefix(m, "/run") || strings.HasPrefix(m, "/etc/") ||
					strings.HasPrefix(m, "/tmp/") || strings.HasPrefix(m, workRoot+"/")
				if !ok {
					t.Errorf("mount point %s in the task's root: not one of the task's", m)
				}
			}
		}
	}
}

// A workspace task's changes to its image (a file in /etc and one in
// /usr/local/bin, the image root's, which the idmapped layers make the
// task's) are on the workspace's file system and seen by its next task.
func TestImageRootWorkspacePersists(t *testing.T) {
	t.Parallel()
	img := buildTestImage(t, true)
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNode, false)
	upper, work, err := w.RootDirs()
	if err != nil {
		t.Fatal(err)
	}
	root := img.root()
	root.UpperDir, root.WorkDir = upper, work
	spec := wsSpec(t, w, `echo kept > /etc/x && printf '#!/bin/sh\necho y\n' > /usr/local/bin/y && chmod +x /usr/local/bin/y && echo owner=$(stat -c %U /etc)`, "", false)
	spec.Root = root
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded || res.Stdout.Tail != "owner=task\n" {
		t.Fatalf("first task: %s: %s: stdout %q, want owner=task\n%s", res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail)
	}
	spec = wsSpec(t, w, `cat /etc/x; y; ls ~/`+WorkspaceRootDir+` 2>&1 >/dev/null | grep -c denied`, "", false)
	spec.Root = root
	res = run(t, ex, spec)
	if want := "kept\ny\n1\n"; res.Reason != ReasonSucceeded || res.Stdout.Tail != want {
		t.Errorf("second task: %s: %s: stdout %q, want %q\n%s", res.Reason, res.Message, res.Stdout.Tail, want, res.Stderr.Tail)
	}
	if b, err := os.ReadFile(filepath.Join(w.Dir(), upper, "etc/x")); err != nil || string(b) != "kept\n" {
		t.Errorf("the change is not in the workspace's upper directory: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(img.layers[1], "etc/x")); err == nil {
		t.Errorf("the task wrote into the image's layer")
	}
}

// With a disk quota, a task's changes to its image count against its
// working directory's size: its private upper directory lies on that
// file system.
func TestImageRootQuota(t *testing.T) {
	t.Parallel()
	img := buildTestImage(t, true)
	ex, _ := quotaExecutor(t, 64<<20, 128<<20, 2000)
	spec := testSpec(t, `dd if=/dev/zero of=/etc/big bs=1M count=100 2>&1; echo rc=$?; ls -a | grep -c `+WorkspaceRootDir)
	spec.User = &User{UID: 2000443, GID: 2000443}
	spec.Root = img.root()
	res := run(t, ex, spec)
	if !strings.Contains(res.Stdout.Tail, "No space left on device") || strings.Contains(res.Stdout.Tail, "rc=0") {
		t.Errorf("100 MiB into /etc of a task with 64 MiB: %q, want dd failing with ENOSPC", res.Stdout.Tail)
	}
	if left, _ := filepath.Glob(filepath.Join(ex.workRoot, privateRootPrefix+"*")); len(left) > 0 {
		t.Errorf("the task's root directories are under the work root: %v", left)
	}
}

// An image without bash fails the task before anything ran, with an
// error of its own naming the image and the shells looked for.
func TestImageRootWithoutBash(t *testing.T) {
	t.Parallel()
	img := buildTestImage(t, false)
	ex := tenantExecutor(t)
	spec := testSpec(t, "true")
	spec.User = &User{UID: 2000442, GID: 2000442}
	spec.Root = img.root()
	_, err := ex.Start(spec)
	if !errors.Is(err, ErrImageShellMissing) || !strings.Contains(err.Error(), img.ref) || !strings.Contains(err.Error(), "/usr/bin/bash") {
		t.Fatalf("Start: %v, want ErrImageShellMissing naming %s and the shells", err, img.ref)
	}
	if left, _ := filepath.Glob(filepath.Join(ex.workRoot, privateRootPrefix+"*")); len(left) > 0 {
		t.Errorf("the task's private root directories are left: %v", left)
	}
}

// Bad roots are refused before anything starts, naming the field.
func TestImageRootSpecChecks(t *testing.T) {
	t.Parallel()
	img := buildTestImage(t, true)
	ex := tenantExecutor(t)
	for name, r := range map[string]*Root{
		"no layers":      {Image: img.ref},
		"relative layer": {Image: img.ref, LowerDirs: []string{"layer"}},
		"missing layer":  {Image: img.ref, LowerDirs: []string{"/nonexistent-layer"}},
		"upper given":    {Image: img.ref, LowerDirs: img.layers, UpperDir: "/tmp/u", WorkDir: "/tmp/w"},
	} {
		spec := testSpec(t, "true")
		spec.Root = r
		if _, err := ex.Start(spec); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "spec.root") {
			t.Errorf("%s: Start: %v, want ErrInvalidSpec naming spec.root", name, err)
		}
	}
}

// benchUIDs is how many task UIDs BenchmarkImageRootStart's tasks take
// in turn.
const benchUIDs = 10

// BenchmarkImageRootStart compares the start latency (Start's call to
// its return: the shell runs) of a tenant task on the node's root with
// one in an image's root (a private upper directory, two layers), each
// with a shim pool, and prints the medians and their difference (the
// target: at most 2 ms more in an image). Sequential tasks of `true`.
func BenchmarkImageRootStart(b *testing.B) {
	img := buildTestImage(b, true)
	ex, err := New(Config{Isolation: IsolationTenant, Cgroups: CgroupAuto, WorkDirRoot: traversableTempDir(b),
		CgroupParent: "bashtask-bench-" + strconv.Itoa(os.Getpid()), ShimPath: testshim.Path(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer ex.Close()
	// The executor makes a user namespace per task UID once (the
	// layers' idmap) and keeps it: made here for the UIDs below, not
	// measured.
	for i := range benchUIDs {
		if _, err := ex.idmaps.get(ex.shimPath, uint32(2000460+i), uint32(2000460+i)); err != nil {
			b.Fatal(err)
		}
	}
	p50, runs := map[string]time.Duration{}, map[string]time.Duration{}
	for _, kind := range []string{"node", "image", "rootinside"} {
		b.Run(kind, func(b *testing.B) {
			var starts, ends []time.Duration
			for i := range b.N {
				spec := Spec{Command: "true", SpillDir: filepath.Join(b.TempDir(), "spill"), User: &User{UID: uint32(2000460 + i%benchUIDs), GID: uint32(2000460 + i%benchUIDs)}}
				if kind != "node" {
					spec.Root = img.root()
					spec.Root.RootInside = kind == "rootinside"
				}
				t0 := time.Now()
				task, err := ex.Start(spec)
				if err != nil {
					b.Fatal(err)
				}
				starts = append(starts, time.Since(t0))
				if res, err := task.Wait(b.Context()); err != nil || res.Reason != ReasonSucceeded {
					b.Fatalf("%v: %s %s", err, res.Reason, res.Message)
				}
				ends = append(ends, time.Since(t0))
			}
			slices.Sort(starts)
			slices.Sort(ends)
			p50[kind], runs[kind] = starts[len(starts)/2], ends[len(ends)/2]
			b.ReportMetric(float64(p50[kind].Microseconds()), "p50-start-µs")
			b.ReportMetric(float64(starts[len(starts)*9/10].Microseconds()), "p90-start-µs")
		})
	}
	b.Logf("start p50: node root %v, image root %v, difference %v (target ≤ 2ms)", p50["node"], p50["image"], p50["image"]-p50["node"])
	// A root-inside task's shell starts after its second stage (a Go
	// program's start): the whole run, start to reaped, shows it.
	b.Logf("run p50 (start to reaped): node root %v, image root %v, image root inside %v", runs["node"], runs["image"], runs["rootinside"])
}
