//go:build linux

package executor

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
)

// noReaperEnv makes a test binary run without BecomeSubreaper, so the
// pidfd wait path is tested too (see TestDirectWaitMode).
const noReaperEnv = "EXECUTOR_TEST_NO_REAPER"

func setupTestProcess() {
	if os.Getenv(noReaperEnv) != "" {
		return
	}
	if err := BecomeSubreaper(); err != nil {
		panic(err)
	}
}

// mechanismTenant keys the tenant-level executor in mechanisms: the
// executor cases run under the shim too.
const mechanismTenant Mechanism = "tenant"

// noTenantEnv leaves the tenant level out of mechanisms.
const noTenantEnv = "EXECUTOR_TEST_NO_TENANT"

// isolationEnv sets the isolation level of every test executor (see
// TestCasesAtTenantLevel).
const isolationEnv = "EXECUTOR_TEST_ISOLATION"

var executorSeq atomic.Int64

// traversableTempDir is a t.TempDir that task UIDs may pass through
// (0711, and its parent, the test's own temporary directory, too), as an
// agent's work root is (the local cluster's is 0711): a task reaches its
// working directory by its node path, and a temporary directory under a
// TMPDIR outside /tmp is not hidden by the task's private /tmp, so its
// mode 0700 would refuse the task's UID.
func traversableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// newTestExecutor returns an executor with its own parent cgroup (removed
// at cleanup), or process groups only when cgroups is CgroupOff. At
// IsolationTenant it starts the static bashtask-shim (testshim.Path) unless
// mutate names another shim.
func newTestExecutor(t *testing.T, cgroups CgroupMode, mutate ...func(*Config)) *Executor {
	t.Helper()
	cfg := Config{
		Cgroups:      cgroups,
		CgroupParent: fmt.Sprintf("bashtask-test-%d-%d", os.Getpid(), executorSeq.Add(1)),
		WorkDirRoot:  traversableTempDir(t),
		Isolation:    Isolation(os.Getenv(isolationEnv)),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	if cfg.Isolation == IsolationTenant && cfg.ShimPath == "" {
		cfg.ShimPath = testshim.Path(t)
	}
	ex, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := ex.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return ex
}

// mechanisms lists the mechanisms this machine can test: process groups
// always, cgroups where a writable cgroup v2 exists.
func mechanisms(t *testing.T) map[Mechanism]*Executor {
	t.Helper()
	out := map[Mechanism]*Executor{MechanismProcessGroup: newTestExecutor(t, CgroupOff)}
	if ex := newTestExecutor(t, CgroupAuto); ex.Mechanism() == MechanismCgroup {
		out[MechanismCgroup] = ex
	} else {
		t.Log("no writable cgroup v2 here: testing process groups only")
	}
	if os.Getenv(noTenantEnv) == "" {
		out[mechanismTenant] = newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant })
	}
	return out
}

// forEachMechanism runs f as a parallel subtest per mechanism.
func forEachMechanism(t *testing.T, f func(t *testing.T, ex *Executor)) {
	t.Helper()
	for mech, ex := range mechanisms(t) {
		t.Run(string(mech), func(t *testing.T) {
			t.Parallel()
			f(t, ex)
		})
	}
}

func testSpec(t *testing.T, command string) Spec {
	spec := Spec{Command: command, SpillDir: filepath.Join(t.TempDir(), "spill"), KillGrace: time.Second}
	if Isolation(os.Getenv(isolationEnv)) == IsolationTenant {
		// As the agent runs a tenant: a UID of its own, not root.
		uid := tenantTestUIDs.Add(1)
		spec.User = &User{UID: uid, GID: uid}
	}
	return spec
}

// tenantTestUIDs hands out the UIDs of the tenant-level reruns.
var tenantTestUIDs = func() *atomic.Uint32 {
	var n atomic.Uint32
	n.Store(2100000)
	return &n
}()

// run starts spec and waits for the result, failing the test on a start
// error or after a minute.
func run(t *testing.T, ex *Executor, spec Spec) Result {
	t.Helper()
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatalf("Start(%q): %v", spec.Command, err)
	}
	return wait(t, task)
}

func wait(t *testing.T, task *Task) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := task.Wait(ctx)
	if err != nil {
		task.Cancel()
		t.Fatalf("Wait: %v", err)
	}
	return res
}

// marker returns a sleep duration that is unique to this call, so the
// test can find exactly its own sleepers in /proc by their command line.
func marker(seconds int) string {
	return fmt.Sprintf("%d.%09d", seconds, rand.IntN(1e9))
}

// withArg lists live processes that have arg in their command line.
// Zombies have an empty command line and do not count.
func withArg(arg string) []int {
	var out []int
	for _, pid := range procfs.PIDs() {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(b, []byte{0}) {
			if string(a) == arg {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// waitFor polls cond every 10 ms until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitForOutput waits until the task's stdout contains s.
func waitForOutput(t *testing.T, task *Task, s string) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%q on stdout", s), func() bool {
		return strings.Contains(task.Snapshot().Stdout.Tail, s)
	})
}

// zombieChildren lists this process's children that are zombies.
func zombieChildren() []int {
	var out []int
	for _, pid := range procfs.PIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && st.PPID == os.Getpid() && st.State == 'Z' {
			out = append(out, pid)
		}
	}
	return out
}
