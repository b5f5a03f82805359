//go:build linux

package executor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// idleShims returns the pids of the pool's idle shims for network.
func idleShims(ex *Executor, network Network) []int {
	ex.pool.mu.Lock()
	defer ex.pool.mu.Unlock()
	var pids []int
	for _, sp := range ex.pool.idle[network] {
		pids = append(pids, sp.proc.Pid)
	}
	return pids
}

// A task at the tenant level takes a shim started ahead of time, whose
// cgroup becomes the task's and carries the task's limits; a network first
// asked for is kept filled from then on; Close kills the idle shims.
func TestShimPool(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.ShimPoolSize = 2 })
	waitFor(t, 30*time.Second, "two idle shims for network Node", func() bool { return len(idleShims(ex, NetworkNode)) == 2 })
	pooled := idleShims(ex, NetworkNode)

	spec := testSpec(t, `echo "pid1=$(cat /proc/1/comm)"; cat /proc/self/cgroup`)
	spec.User = &User{UID: 2000321, GID: 2000321}
	spec.Limits.Pids = 64
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !task.PooledShim() || !slices.Contains(pooled, task.PID()) {
		t.Errorf("the task's shim is pid %d, not one of the idle shims %v", task.PID(), pooled)
	}
	cg := task.CgroupPath()
	if ex.Mechanism() == MechanismCgroup {
		if !strings.HasPrefix(filepath.Base(cg), PoolCgroupPrefix) {
			t.Errorf("CgroupPath() = %q, want the pooled shim's cgroup (%s...)", cg, PoolCgroupPrefix)
		}
		if slices.Contains(ex.Controllers(), "pids") {
			if b, err := os.ReadFile(filepath.Join(cg, "pids.max")); err != nil || strings.TrimSpace(string(b)) != "64" {
				t.Errorf("pids.max of the task's cgroup = %q (%v), want 64", b, err)
			}
		}
	}
	res := wait(t, task)
	if res.Reason != ReasonSucceeded || !strings.HasPrefix(res.Stdout.Tail, "pid1=") {
		t.Fatalf("task: %s (%s), stdout %q", res.Reason, res.Message, res.Stdout.Tail)
	}
	if cg != "" && !strings.Contains(res.Stdout.Tail, "/"+filepath.Base(cg)+"\n") {
		t.Errorf("/proc/self/cgroup of the shell:\n%s\nwant the task's cgroup %s", res.Stdout.Tail, cg)
	}
	if _, err := os.Stat(cg); cg != "" && err == nil {
		t.Errorf("the task's cgroup %s is still there after the task", cg)
	}

	// Network None: the first task starts its own shim, then the pool
	// keeps None shims too.
	none := testSpec(t, "true")
	none.Network = NetworkNone
	task, err = ex.Start(none)
	if err != nil {
		t.Fatal(err)
	}
	if res := wait(t, task); res.Reason != ReasonSucceeded || task.PooledShim() {
		t.Fatalf("first task with network None: %s (%s), pooled shim %v; want Succeeded with a shim of its own", res.Reason, res.Message, task.PooledShim())
	}
	waitFor(t, 30*time.Second, "two idle shims for network None", func() bool { return len(idleShims(ex, NetworkNone)) == 2 })
	waitFor(t, 30*time.Second, "the Node pool refilled", func() bool { return len(idleShims(ex, NetworkNode)) == 2 })
	idle := append(idleShims(ex, NetworkNode), idleShims(ex, NetworkNone)...)

	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range idle {
		if err := unix.Kill(pid, 0); err == nil {
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(st), ") Z ") {
				t.Errorf("idle shim %d still runs after Close", pid)
			}
		}
	}
}

// The cgroups of pooled shims an earlier executor left under the parent
// (with whatever runs in them) are emptied and removed when a tenant
// executor starts on that parent.
func TestSweepPoolCgroups(t *testing.T) {
	t.Parallel()
	parent := fmt.Sprintf("bashtask-test-sweep-%d", os.Getpid())
	first := newTestExecutor(t, CgroupAuto, func(c *Config) { c.CgroupParent = parent; c.ShimPoolSize = -1 })
	if first.Mechanism() != MechanismCgroup {
		testutil.SkipUnlessStrict(t, "no writable cgroup v2 here: the pool's cgroups exist only with one")
	}
	left := filepath.Join(first.CgroupPath(), PoolCgroupPrefix+"left")
	if err := os.Mkdir(left, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = sleeper.Wait(); close(exited) }()
	t.Cleanup(func() { _ = sleeper.Process.Kill(); <-exited })
	if err := os.WriteFile(filepath.Join(left, "cgroup.procs"), []byte(fmt.Sprint(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	// Another task's cgroup is not the sweep's business.
	other := filepath.Join(first.CgroupPath(), "task-other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeCgroup(other) })

	newTestExecutor(t, CgroupRequired, func(c *Config) { c.CgroupParent = parent; c.Isolation = IsolationTenant; c.ShimPoolSize = -1 })
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the earlier shim cgroup still runs")
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("%s: %v, want it removed", left, err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("%s: %v, want it left alone", other, err)
	}
}
