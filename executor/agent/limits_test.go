package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// memoryTaskSpec is a task asking for 256 MiB of memory.
func memoryTaskSpec(uid, command string) *agentv1.TaskSpec {
	spec := taskSpec(uid, command)
	spec.Resources = &agentv1.Resources{MemoryBytes: 256 << 20}
	return spec
}

// nodesWithoutMemory are agents whose task cgroups lack the memory
// controller: one without cgroups, and one on this node's own cgroup v2,
// which on hosts of the hybrid layout (cgroup v2 at
// /sys/fs/cgroup/unified with no controllers) has none.
var nodesWithoutMemory = map[string]rigOption{
	"no cgroups":         func(c *Config) { c.Executor.Cgroups = executor.CgroupOff },
	"this node's cgroup": func(*Config) {},
}

// skipWithMemory skips a case whose agent turned out to enforce memory.
func skipWithMemory(t *testing.T, r *rig) {
	t.Helper()
	if slices.Contains(r.srv.ex.Controllers(), "memory") {
		t.Skipf("the task cgroups of this node have the memory controller (%v): the case needs a node without", r.srv.ex.Controllers())
	}
}

// A task asking for a memory limit its node does not enforce says so from
// its start: in the Start reply, the STARTED event and Get while it runs,
// not only once it finished. The readiness says so before any task.
func TestLimitsNotEnforcedFromTheStart(t *testing.T) {
	for name, opt := range nodesWithoutMemory {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, opt)
			skipWithMemory(t, r)
			info, next := r.watch()
			if got := info.GetReadiness().GetEnforcedLimits(); slices.Contains(got, "memory") {
				t.Errorf("readiness enforced_limits %v: want no memory", got)
			}
			resp, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: memoryTaskSpec("uid-mem", "sleep 30")})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"memory"}
			if diff := cmp.Diff(want, resp.GetStatus().GetLimitsNotEnforced()); diff != "" {
				t.Errorf("Start reply limits_not_enforced (-want +got):\n%s", diff)
			}
			started := until(t, next, agentv1.EventType_EVENT_TYPE_STARTED).GetStatus()
			if diff := cmp.Diff(want, started.GetLimitsNotEnforced()); diff != "" {
				t.Errorf("STARTED limits_not_enforced (-want +got):\n%s", diff)
			}
			got, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "uid-mem"})
			if err != nil {
				t.Fatal(err)
			}
			if got.GetStatus().GetState() != agentv1.TaskState_TASK_STATE_RUNNING || !slices.Equal(got.GetStatus().GetLimitsNotEnforced(), want) {
				t.Errorf("Get while running: state %v, limits_not_enforced %v; want RUNNING with %v", got.GetStatus().GetState(), got.GetStatus().GetLimitsNotEnforced(), want)
			}
			if _, err := r.client.Cancel(t.Context(), &agentv1.CancelRequest{Uid: "uid-mem"}); err != nil {
				t.Fatal(err)
			}
			fin := until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED).GetStatus()
			if !slices.Equal(fin.GetLimitsNotEnforced(), want) {
				t.Errorf("FINISHED limits_not_enforced %v, want %v", fin.GetLimitsNotEnforced(), want)
			}
		})
	}
}

// An agent with --unenforced-limits=refuse ends such a task StartFailed,
// naming the limit, and runs nothing of it; a task without limits runs.
func TestUnenforcedLimitsRefused(t *testing.T) {
	for name, opt := range nodesWithoutMemory {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, opt, func(c *Config) { c.UnenforcedLimits = UnenforcedRefuse })
			skipWithMemory(t, r)
			marker := filepath.Join(r.dir, "ran")
			resp, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: memoryTaskSpec("uid-refused", "touch "+marker)})
			if err != nil {
				t.Fatal(err)
			}
			st := resp.GetStatus()
			if st.GetState() != agentv1.TaskState_TASK_STATE_FINISHED || st.GetReason() != "StartFailed" {
				t.Fatalf("status %v: want a finished StartFailed task", st)
			}
			for _, want := range []string{"spec.resources asks for memory", "node-a does not enforce", "--unenforced-limits=refuse"} {
				if !strings.Contains(st.GetMessage(), want) {
					t.Errorf("message %q: want it to contain %q", st.GetMessage(), want)
				}
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the refused command ran")
			}
			plain, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-plain", "true")})
			if err != nil {
				t.Fatal(err)
			}
			if plain.GetStatus().GetReason() == "StartFailed" {
				t.Errorf("a task without limits: %v, want it started", plain.GetStatus())
			}
		})
	}
}

func TestParseUnenforcedPolicy(t *testing.T) {
	for in, want := range map[string]UnenforcedPolicy{"": UnenforcedWarn, "warn": UnenforcedWarn, "refuse": UnenforcedRefuse} {
		if got, err := ParseUnenforcedPolicy(in); err != nil || got != want {
			t.Errorf("ParseUnenforcedPolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseUnenforcedPolicy("ignore"); err == nil || !strings.Contains(err.Error(), `--unenforced-limits "ignore"`) {
		t.Errorf("ParseUnenforcedPolicy(ignore) = %v, want an error naming the flag and value", err)
	}
}

// A disk size is never enforced for a working directory the spec names,
// nor where fresh directories get no quota; the other limits follow the
// enforced list.
func TestNotEnforcedFor(t *testing.T) {
	ex, err := executor.New(executor.Config{Cgroups: executor.CgroupOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ex.Close() })
	es := &executor.Spec{Limits: executor.Limits{MemoryBytes: 1, CPUMillis: 1, Pids: 1, DiskBytes: 1}}
	if diff := cmp.Diff([]string{"memory", "cpu", "pids", "ephemeral-storage"}, notEnforcedFor(ex, es)); diff != "" {
		t.Errorf("without cgroups or a quota (-want +got):\n%s", diff)
	}
	if got := notEnforcedFor(ex, &executor.Spec{}); len(got) != 0 {
		t.Errorf("no limits asked for: %v, want none", got)
	}
}
