//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// hasEnv reports whether the environment of pid contains the exact entry
// kv ("NAME=VALUE"). Reading another user's environ needs root or
// CAP_SYS_PTRACE, which an agent that runs tasks as other users has.
func hasEnv(pid int, kv string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	for _, e := range bytes.Split(b, []byte{0}) {
		if string(e) == kv {
			return true
		}
	}
	return false
}

// bootID identifies the running kernel boot. It is read once: it changes
// only with a reboot, which this process does not outlive.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// stopLeftovers kills whatever is left of a task of an earlier incarnation
// and returns how many processes it killed.
//
//   - With a cgroup (recorded before the shell was created, so known even if
//     the agent died during the start): when it exists, cgroup.kill takes
//     every process of the task, also one that left the session, and
//     nothing else is needed. A missing cgroup means no process of the task
//     is left: every one was born in it, and the executor removes it only
//     once it is empty; the next step then finds nothing to signal.
//   - Otherwise the recorded process group, only when its leader is
//     provably the recorded shell (same start time): a pid is never
//     signalled on a guess, since ids get reused.
//   - Without a cgroup, last, any process whose environment still carries
//     the task's marker. Only this finds what a process group cannot: the
//     shell of a task whose pid never reached the record (the agent died
//     during the start), descendants left in the group after the shell
//     exited (the group id is then not provably the task's), and processes
//     that left the group with setsid.
//
// Processes are killed with SIGKILL at once: their output pipes died with
// the earlier agent, so a grace period would only give them time to be
// killed by SIGPIPE.
func stopLeftovers(p processRecord, marker string) (int, error) {
	if p.BootID != "" && p.BootID != bootID() {
		return 0, nil // the node rebooted: nothing of the task is left
	}
	if p.Cgroup != "" {
		path := p.Cgroup
		if _, err := os.Stat(path); err != nil {
			// At the tenant level a task takes the cgroup its shim was
			// started in ahead of time, which the record names only once
			// the start returned: the one whose processes carry the marker.
			path = pooledCgroupOf(filepath.Dir(p.Cgroup), marker)
		}
		if path != "" {
			victims, err := executor.KillCgroup(path)
			return len(victims), err
		}
	}
	victims := map[int]bool{}
	var errs []error
	if p.PID > 0 && p.StartTicks != 0 {
		if st, err := procfs.ReadStat(p.PID); err == nil && st.StartTicks == p.StartTicks && st.PGRP == p.PID {
			for _, pid := range procfs.PIDs() {
				if s, err := procfs.ReadStat(pid); err == nil && s.PGRP == p.PID && s.State != 'Z' {
					victims[pid] = true
				}
			}
			if err := unix.Kill(-p.PID, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("killing process group %d: %w", p.PID, err))
			}
		}
	}
	if p.Cgroup == "" {
		for _, pid := range procfs.PIDs() {
			if pid == os.Getpid() || victims[pid] {
				continue
			}
			if st, err := procfs.ReadStat(pid); err == nil && st.State != 'Z' && hasEnv(pid, marker) {
				if err := unix.Kill(pid, unix.SIGKILL); err == nil {
					victims[pid] = true
				}
			}
		}
	}
	// kill(2) returns before the target has run its exit: wait (up to two
	// seconds, as executor.KillCgroup does) until every victim is gone or a zombie,
	// so "stopped" in the report means stopped.
	if left := waitGone(victims, 2*time.Second); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes %v still alive 2 s after SIGKILL", left))
	}
	return len(victims), errors.Join(errs...)
}

// waitGone polls until none of pids runs any more (gone, or a zombie
// waiting for its parent) or timeout passes; it returns those still
// running.
func waitGone(pids map[int]bool, timeout time.Duration) []int {
	deadline := time.Now().Add(timeout)
	for {
		var left []int
		for pid := range pids {
			if st, err := procfs.ReadStat(pid); err == nil && st.State != 'Z' {
				left = append(left, pid)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pooledCgroupOf returns the cgroup under parent named with
// executor.PoolCgroupPrefix in which a process carries marker in its
// environment, or "" when there is none.
func pooledCgroupOf(parent, marker string) string {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), executor.PoolCgroupPrefix) {
			continue
		}
		path := filepath.Join(parent, e.Name())
		procs, _ := executor.CgroupProcs(path)
		for _, pid := range procs {
			if hasEnv(pid, marker) {
				return path
			}
		}
	}
	return ""
}
