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

	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// A running task names its shell (pid, start time), its cgroup and its
// working directory, so that a later agent can find and clean them up.
func TestTaskIdentity(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		task, err := ex.Start(testSpec(t, "echo ready; exec sleep 60"))
		if err != nil {
			t.Fatal(err)
		}
		defer task.Cancel()
		waitForOutput(t, task, "ready")

		pid := task.PID()
		st, err := procfs.ReadStat(pid)
		switch {
		case pid <= 0 || err != nil:
			t.Fatalf("PID() = %d, /proc stat: %v", pid, err)
		case st.StartTicks == 0 || st.StartTicks != task.ProcessStart():
			t.Errorf("ProcessStart() = %d, /proc/%d/stat says %d", task.ProcessStart(), pid, st.StartTicks)
		case st.PGRP != pid || st.Session != pid:
			t.Errorf("pid %d has process group %d and session %d, want both equal to the pid", pid, st.PGRP, st.Session)
		}

		cg := task.CgroupPath()
		if ex.Mechanism() == MechanismCgroup {
			b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
			if err != nil || filepath.Dir(cg) != ex.CgroupPath() || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid)) {
				t.Errorf("CgroupPath() = %q (parent %q), cgroup.procs %q (err %v), want the shell %d in a child of the parent", cg, ex.CgroupPath(), b, err, pid)
			}
		} else if cg != "" {
			t.Errorf("CgroupPath() = %q without cgroups, want empty", cg)
		}

		wd := task.WorkingDir()
		if fi, err := os.Stat(wd); err != nil || !fi.IsDir() || !strings.HasPrefix(filepath.Base(wd), "bashtask-work-") {
			t.Errorf("WorkingDir() = %q (err %v), want the fresh per-task directory", wd, err)
		}
		task.Cancel()
		res := wait(t, task)
		if res.PID != pid {
			t.Errorf("Result.PID = %d, PID() = %d", res.PID, pid)
		}
		if _, err := os.Stat(wd); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("fresh working directory %s after the end: %v, want it removed", wd, err)
		}
		if cg != "" {
			if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("task cgroup %s after the end: %v, want it removed", cg, err)
			}
		}
	})
}

// A working directory named in the spec is reported as is and kept.
func TestTaskWorkingDirFromSpec(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupOff)
	spec := testSpec(t, "true")
	spec.WorkingDir = t.TempDir()
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := task.WorkingDir(); got != spec.WorkingDir {
		t.Errorf("WorkingDir() = %q, want %q", got, spec.WorkingDir)
	}
	wait(t, task)
	if _, err := os.Stat(spec.WorkingDir); err != nil {
		t.Errorf("working directory of the spec after the end: %v, want it kept", err)
	}
}
