//go:build linux

package executor

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// A process that leaves the session with setsid is still in the task's
// cgroup, is counted and dies.
func TestSetsidEscapeeDiesWithCgroup(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	if ex.Mechanism() != MechanismCgroup {
		testutil.SkipUnlessStrict(t, "no writable cgroup v2 here")
	}
	m := marker(300)
	res := run(t, ex, testSpec(t, fmt.Sprintf("setsid sleep %s >/dev/null 2>&1 & echo started", m)))
	if res.Reason != ReasonSucceeded || res.LeftoverProcesses != 1 || res.Mechanism != MechanismCgroup {
		t.Errorf("got %s, %d leftovers, mechanism %s; want Succeeded, 1, cgroup", res.Reason, res.LeftoverProcesses, res.Mechanism)
	}
	if alive := withArg(m); len(alive) > 0 {
		t.Errorf("escapee %v still alive", alive)
	}
}

// Cancel while the task floods stdout: the stop and the readers finish.
func TestCancelDuringHeavyOutput(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		spec := testSpec(t, "yes")
		spec.SpillLimitBytes = 1 << 20
		task, err := ex.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "10 MB of output", func() bool { return task.Snapshot().Stdout.TotalBytes > 10<<20 })
		task.Cancel()
		res := wait(t, task)
		if res.Reason != ReasonCancelled || !res.Stdout.Truncated || res.Stdout.SpillComplete {
			t.Errorf("got %s truncated %v spill complete %v", res.Reason, res.Stdout.Truncated, res.Stdout.SpillComplete)
		}
	})
}

// Tasks run as another user, in a fresh working directory owned by it.
func TestRunAsUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	// The default working directory must be reachable for the user.
	root, err := os.MkdirTemp("", "bashtask-user-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o711); err != nil {
		t.Fatal(err)
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.WorkDirRoot = root })
	spec := testSpec(t, "id -u; id -g; id -G; stat -c %u:%a .; pwd")
	spec.User = &User{UID: 65534, GID: 65534}
	res := run(t, ex, spec)
	lines := strings.Split(strings.TrimSuffix(res.Stdout.Tail, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("stdout %q stderr %q", res.Stdout.Tail, res.Stderr.Tail)
	}
	if diff := cmp.Diff([]string{"65534", "65534", "65534", "65534:700"}, lines[:4]); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(lines[4]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("default working directory %s not removed: %v", lines[4], err)
	}
}

func TestSpillFiles(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	t.Run("modes", func(t *testing.T) {
		t.Parallel()
		res := run(t, ex, testSpec(t, "echo x; echo y >&2"))
		for path, want := range map[string]os.FileMode{filepath.Dir(res.Stdout.SpillPath): 0o700, res.Stdout.SpillPath: 0o600, res.Stderr.SpillPath: 0o600} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s: %v", path, err)
			} else if fi.Mode().Perm() != want {
				t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
			}
		}
	})
	t.Run("a missing directory is made with the first byte", func(t *testing.T) {
		t.Parallel()
		quiet := testSpec(t, "true")
		if res := run(t, ex, quiet); res.Reason != ReasonSucceeded {
			t.Fatalf("true: %s", res.Reason)
		}
		if _, err := os.Lstat(quiet.SpillDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("spill directory of a task that printed nothing: %v, want none", err)
		}
		loud := testSpec(t, "echo x >&2")
		res := run(t, ex, loud)
		if fi, err := os.Lstat(loud.SpillDir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("spill directory after output: %v (err %v), want a 0700 directory", fi, err)
		}
		if b, err := os.ReadFile(res.Stderr.SpillPath); err != nil || string(b) != "x\n" {
			t.Errorf("stderr spill file: %q, %v", b, err)
		}
	})
	t.Run("an empty stream has no file", func(t *testing.T) {
		t.Parallel()
		res := run(t, ex, testSpec(t, "echo x"))
		if _, err := os.Lstat(res.Stderr.SpillPath); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stderr spill file of a command that wrote no stderr: %v, want none", err)
		}
		want := StreamResult{SHA256: fmt.Sprintf("%x", sha256.Sum256(nil)), SpillPath: res.Stderr.SpillPath, SpillComplete: true}
		if diff := cmp.Diff(want, res.Stderr); diff != "" {
			t.Errorf("empty stderr (-want +got):\n%s", diff)
		}
		if res.Stdout.SpillBytes != 2 || !res.Stdout.SpillComplete {
			t.Errorf("stdout: %d spill bytes (complete %v), want 2, complete", res.Stdout.SpillBytes, res.Stdout.SpillComplete)
		}
	})
	t.Run("directory open to others is refused", func(t *testing.T) {
		t.Parallel()
		spec := testSpec(t, "true")
		if err := os.Mkdir(spec.SpillDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(spec.SpillDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := ex.Start(spec); !errors.Is(err, ErrSpillDir) {
			t.Fatalf("Start: %v, want ErrSpillDir", err)
		}
	})
	t.Run("existing spill file is refused", func(t *testing.T) {
		t.Parallel()
		spec := testSpec(t, "true")
		if err := os.Mkdir(spec.SpillDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/etc/passwd", filepath.Join(spec.SpillDir, "stderr")); err != nil {
			t.Fatal(err)
		}
		if _, err := ex.Start(spec); !errors.Is(err, ErrSpillDir) {
			t.Fatalf("Start: %v, want ErrSpillDir", err)
		}
		if _, err := os.Stat(filepath.Join(spec.SpillDir, "stdout")); err == nil {
			t.Errorf("stdout spill file left behind by a failed start")
		}
	})
	t.Run("default spill directory", func(t *testing.T) {
		t.Parallel()
		spec := testSpec(t, "echo x")
		spec.SpillDir = ""
		res := run(t, ex, spec)
		defer os.RemoveAll(filepath.Dir(res.Stdout.SpillPath))
		if b, err := os.ReadFile(res.Stdout.SpillPath); err != nil || string(b) != "x\n" {
			t.Errorf("spill %q, %v", b, err)
		}
	})
}

func TestSnapshotWhileRunning(t *testing.T) {
	t.Parallel()
	task, err := newTestExecutor(t, CgroupAuto).Start(testSpec(t, "echo first; echo oops >&2; sleep "+marker(60)))
	if err != nil {
		t.Fatal(err)
	}
	waitForOutput(t, task, "first")
	snap := task.Snapshot()
	if _, done := task.Result(); done {
		t.Fatalf("task over while sleeping")
	}
	task.Cancel()
	wait(t, task)
	if snap.Stdout.Tail != "first\n" || snap.Stdout.TotalBytes != 6 {
		t.Errorf("stdout snapshot %+v", snap.Stdout)
	}
}

func TestResultMechanism(t *testing.T) {
	t.Parallel()
	for mech, ex := range mechanisms(t) {
		if mech == mechanismTenant {
			mech = MechanismCgroup // the tenant level runs in a cgroup too
		}
		if res := run(t, ex, testSpec(t, "true")); res.Mechanism != mech || ex.Mechanism() != mech {
			t.Errorf("executor %s: result mechanism %s", mech, res.Mechanism)
		}
	}
}

func TestParseCgroup2Mounts(t *testing.T) {
	mountinfo := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
50 40 0:40 /kubepods/pod1 /sys/fs/cgroup\040x rw - cgroup2 cgroup2 rw,nsdelegate
`
	want := []cgroupMount{{"/", "/sys/fs/cgroup/unified"}, {"/kubepods/pod1", "/sys/fs/cgroup x"}}
	if diff := cmp.Diff(want, parseCgroup2Mounts(mountinfo), cmp.AllowUnexported(cgroupMount{})); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
}

func TestClassify(t *testing.T) {
	exited := func(code int) exitStatus { return exitStatus{status: unix.WaitStatus(code << 8)} }
	killed := func(sig syscall.Signal) exitStatus { return exitStatus{status: unix.WaitStatus(sig)} }
	type out struct {
		Reason   Reason
		ExitCode int
		Signal   string
	}
	tests := []struct {
		name  string
		cause Reason
		oom   bool
		st    exitStatus
		want  out
	}{
		{"exit 0", "", false, exited(0), out{ReasonSucceeded, 0, ""}},
		{"exit 42", "", false, exited(42), out{ReasonNonZeroExit, 42, ""}},
		{"signal", "", false, killed(syscall.SIGTERM), out{ReasonSignaled, 143, "SIGTERM"}},
		{"oom beats signal", "", true, killed(syscall.SIGKILL), out{ReasonOOMKilled, 137, "SIGKILL"}},
		{"deadline beats exit 0", ReasonTimedOut, false, exited(0), out{ReasonTimedOut, 0, ""}},
		{"deadline beats oom", ReasonTimedOut, true, killed(syscall.SIGKILL), out{ReasonTimedOut, 137, "SIGKILL"}},
		{"cancel", ReasonCancelled, false, killed(syscall.SIGKILL), out{ReasonCancelled, 137, "SIGKILL"}},
		{"status lost", "", false, exitStatus{err: errors.New("gone")}, out{ReasonNonZeroExit, -1, ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, c, s := classify(tc.cause, tc.oom, tc.st)
			if diff := cmp.Diff(tc.want, out{r, c, s}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestDirectWaitMode runs the process cases again in a test binary that
// never becomes a subreaper, so the pidfd wait path is covered too. The
// child test binary runs as a task of this one, which keeps the reaper in
// charge of every wait of this process.
func TestDirectWaitMode(t *testing.T) {
	t.Parallel()
	if os.Getenv(noReaperEnv) != "" {
		t.Skip("already the direct-wait run")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec(t, fmt.Sprintf("exec %s -test.run '^(TestC0[1-7]|TestC1[0-4]|TestC2[2-6]|TestExitCodeAndSignalMapping|TestStdinModes|TestCancelDuringHeavyOutput|TestReaperConcurrentStartsGetTheirOwnStatus|TestTaskIdentity)' -test.count=1 2>&1", self))
	spec.Env = []EnvVar{{noReaperEnv, "1"}, {testshim.EnvVar, testshim.Path(t)}}
	spec.TailBytes = MaxTailBytes
	spec.Timeout = 2 * time.Minute
	res := run(t, newTestExecutor(t, CgroupAuto), spec)
	if res.Reason != ReasonSucceeded || !strings.HasSuffix(res.Stdout.Tail, "PASS\n") || strings.Contains(res.Stdout.Tail, "no tests to run") {
		t.Fatalf("direct-wait run: %s (%s)\n%s", res.Reason, res.Message, res.Stdout.Tail)
	}
}

// A task cgroup of the same name left by an earlier run (a process killed
// before it removed it) is replaced when empty, children included, and
// refused when it holds processes.
func TestStaleTaskCgroup(t *testing.T) {
	p, err := setupCgroupParent("", "bashtask-executor-stale-test")
	if err != nil {
		testutil.SkipUnlessStrictf(t, "no writable cgroup v2 here: %v", err)
	}
	t.Cleanup(func() { _ = removeCgroupTree(p.path) })

	stale := filepath.Join(p.path, "task-x")
	if err := os.MkdirAll(filepath.Join(stale, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	cg, _, err := p.create("task-x", Limits{})
	if err != nil {
		t.Fatalf("create over an empty stale cgroup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stale, "child")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale cgroup's child is still there: %v", err)
	}
	cg.closeFD()
	if err := cg.remove(); err != nil {
		t.Fatal(err)
	}

	busy := filepath.Join(p.path, "task-y")
	if err := os.Mkdir(busy, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(fmt.Sprint(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.create("task-y", Limits{}); err == nil || !strings.Contains(err.Error(), "holds processes") {
		t.Errorf("create over a populated cgroup: %v, want a refusal", err)
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
}
