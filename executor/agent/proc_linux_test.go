//go:build linux

package agent

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// startGroup starts `sh -c command` as the leader of a new session and
// process group with env added, and returns it with its start time. The
// caller waits for it.
func startGroup(t *testing.T, command string, env ...string) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Only a group that still has members: the kernel does not hand
		// out a pid still in use as a process group id.
		if groupSize(cmd.Process.Pid) > 0 {
			_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		}
	})
	st, err := procfs.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, st.StartTicks
}

// groupSize counts the live processes of process group pgid.
func groupSize(pgid int) int { return len(groupPIDs(pgid)) }

// waitExeced waits until process pid runs prog (its argv[0]) with kv in
// its environment. exec(2) swaps in the new program's memory before it
// lays out its arguments and environment there, and a shell's child runs
// the shell until its own exec: until then /proc shows the test's
// environment, the shell's, or none at all, so a scan for kv would miss
// the process for a reason that has nothing to do with the code under test.
// os/exec's Start returning does not close that window (it learns of the
// exec from a close-on-exec pipe, which closes before the layout).
func waitExeced(t *testing.T, pid int, prog, kv string) {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	execed := func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			return false
		}
		argv0, _, _ := bytes.Cut(b, []byte{0})
		return filepath.Base(string(argv0)) == prog && hasEnv(pid, kv)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !execed() {
		if time.Now().After(deadline) {
			cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
			t.Fatalf("process %d runs %q after 20 s, want %s with %s in its environment", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), prog, kv)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupPIDs lists the live processes of process group pgid.
func groupPIDs(pgid int) []int {
	var pids []int
	for _, pid := range procfs.PIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && st.PGRP == pgid && st.State != 'Z' {
			pids = append(pids, pid)
		}
	}
	return pids
}

func waitGroupSize(t *testing.T, pgid, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for groupSize(pgid) != want {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d has %d live processes, want %d", pgid, groupSize(pgid), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A recorded process group is killed only while its leader is provably the
// recorded shell.
func TestStopLeftoversProcessGroup(t *testing.T) {
	t.Parallel()
	cmd, ticks := startGroup(t, "sleep 60 & wait")
	pid := cmd.Process.Pid
	waitGroupSize(t, pid, 2)

	n, err := stopLeftovers(processRecord{PID: pid, StartTicks: ticks + 1}, EnvUID+"=not-this-one")
	if err != nil || n != 0 || groupSize(pid) != 2 {
		t.Fatalf("start time differs: killed %d (err %v), group has %d; want nothing signalled", n, err, groupSize(pid))
	}
	n, err = stopLeftovers(processRecord{PID: pid}, EnvUID+"=not-this-one")
	if err != nil || n != 0 || groupSize(pid) != 2 {
		t.Fatalf("start time unknown: killed %d (err %v), group has %d; want nothing signalled", n, err, groupSize(pid))
	}
	n, err = stopLeftovers(processRecord{PID: pid, StartTicks: ticks}, EnvUID+"=not-this-one")
	if err != nil || n != 2 {
		t.Errorf("start time matches: killed %d (err %v), want 2", n, err)
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("shell ended with %v, want SIGKILL", err)
	}
	waitGroupSize(t, pid, 0)
}

// Without a cgroup, processes the group check cannot prove to be the
// task's (here: the shell exited, its child lives on in the group) are
// found by the task's marker in their environment. With a cgroup recorded
// the marker is not looked for: the cgroup alone decides.
func TestStopLeftoversMarkerFallback(t *testing.T) {
	t.Parallel()
	marker := EnvUID + "=marker-" + itoa(os.Getpid())
	cmd, ticks := startGroup(t, "sleep 60 & exit 0", marker)
	pid := cmd.Process.Pid
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	waitGroupSize(t, pid, 1) // the orphaned sleep
	// The marker scan reads the environment: it must find a sleep that
	// has finished its exec, not a forked shell caught in between.
	waitExeced(t, groupPIDs(pid)[0], "sleep", marker)

	n, err := stopLeftovers(processRecord{PID: pid, StartTicks: ticks, Cgroup: "/nonexistent/cgroup"}, marker)
	if err != nil || n != 0 || groupSize(pid) != 1 {
		t.Fatalf("missing cgroup recorded: killed %d (err %v), group has %d; want nothing signalled", n, err, groupSize(pid))
	}
	n, err = stopLeftovers(processRecord{PID: pid, StartTicks: ticks}, marker)
	if err != nil || n != 1 {
		t.Errorf("process group mode: killed %d (err %v), want the orphaned sleep", n, err)
	}
	waitGroupSize(t, pid, 0)
}

// Right after Start the durable record names the shell (pid and start
// time), the task's cgroup and its fresh working directory, which is what
// a later incarnation needs to stop and clean up the task.
func TestStartRecordsProcessIdentity(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	const uid = "uid-identity"
	resp, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec(uid, "exec sleep 60")})
	if err != nil {
		t.Fatal(err)
	}
	// A running task shows the isolation it got, not only a finished one.
	if st := resp.GetStatus(); st.GetState() != agentv1.TaskState_TASK_STATE_RUNNING || st.GetIsolation().GetLevel() != string(r.srv.ex.Isolation()) {
		t.Errorf("Start answered state %s, isolation %v; want a running task at level %s", st.GetState(), st.GetIsolation(), r.srv.ex.Isolation())
	}
	rec, _, err := r.srv.store.read(uid)
	if err != nil {
		t.Fatal(err)
	}
	p := rec.Process
	st, err := procfs.ReadStat(p.PID)
	if rec.State != stateRunning || err != nil || p.StartTicks == 0 || st.StartTicks != p.StartTicks || st.PGRP != p.PID {
		t.Errorf("record %+v state %s; /proc stat %+v (err %v): want the running shell's pid and start time", p, rec.State, st, err)
	}
	r.srv.mu.Lock()
	ex := r.srv.ex
	r.srv.mu.Unlock()
	if ex.Mechanism() == executor.MechanismCgroup {
		if p.Cgroup != filepath.Join(ex.CgroupPath(), uid) {
			t.Errorf("recorded cgroup %q, want %q", p.Cgroup, filepath.Join(ex.CgroupPath(), uid))
		}
	} else if p.Cgroup != "" {
		t.Errorf("recorded cgroup %q without cgroups, want none", p.Cgroup)
	}
	if fi, err := os.Stat(p.WorkDir); err != nil || !fi.IsDir() {
		t.Errorf("recorded working directory %q: %v, want the task's fresh directory", p.WorkDir, err)
	}
	if _, err := r.client.Cancel(t.Context(), &agentv1.CancelRequest{Uid: uid}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	if _, err := os.Stat(p.WorkDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("working directory after the end: %v, want it removed", err)
	}
}

// At the tenant level a task whose start the earlier incarnation did not
// live to record runs in a pooled shim's cgroup, not in the cgroup its
// first record names: the one whose process carries the task's marker is
// emptied and removed, another is left alone.
func TestStopLeftoversPooledCgroup(t *testing.T) {
	t.Parallel()
	ex, err := executor.New(executor.Config{Cgroups: executor.CgroupAuto, CgroupParent: testCgroupParent + "-pooled"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ex.Close() })
	if ex.Mechanism() != executor.MechanismCgroup {
		testutil.SkipUnlessStrict(t, "no writable cgroup v2 here: pooled cgroups exist only with one")
	}
	marker := EnvUID + "=pooled-" + itoa(os.Getpid())
	inCgroup := func(name string, env ...string) (*exec.Cmd, string) {
		path := filepath.Join(ex.CgroupPath(), name)
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd, _ := startGroup(t, "exec sleep 60", env...)
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = unix.Rmdir(path) })
		// The scan looks for the marker in the environment, which the
		// process shows only once sleep's exec is complete.
		waitExeced(t, cmd.Process.Pid, "sleep", env[0])
		if err := os.WriteFile(filepath.Join(path, "cgroup.procs"), []byte(itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		return cmd, path
	}
	_, theirs := inCgroup(executor.PoolCgroupPrefix+"theirs", EnvUID+"=someone-else")
	_, ours := inCgroup(executor.PoolCgroupPrefix+"ours", marker)

	n, err := stopLeftovers(processRecord{Cgroup: filepath.Join(ex.CgroupPath(), "uid-never-created")}, marker)
	if err != nil || n != 1 {
		t.Errorf("stopLeftovers: killed %d (err %v), want the one process of the pooled cgroup with the marker", n, err)
	}
	if _, err := os.Stat(ours); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v, want it removed", ours, err)
	}
	if procs, err := executor.CgroupProcs(theirs); err != nil || len(procs) != 1 {
		t.Errorf("the other pooled cgroup holds %v (err %v), want its process untouched", procs, err)
	}
}
