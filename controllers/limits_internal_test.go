package controllers

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// memoryTask asks for a memory limit, with mutate applied.
func memoryTask(mutate ...func(*bashtaskv1alpha1.BashTask)) *bashtaskv1alpha1.BashTask {
	bt := &bashtaskv1alpha1.BashTask{Spec: bashtaskv1alpha1.BashTaskSpec{
		Resources: &bashtaskv1alpha1.ResourceLimits{Memory: ptr.To(resource.MustParse("256Mi"))},
	}}
	for _, m := range mutate {
		m(bt)
	}
	return bt
}

// Among the agents that fit, one whose node enforces every limit the task
// asks for is chosen, even when busier; without one that fits, the task
// goes where it fits, enforced or not.
func TestPlacementPrefersEnforcingAgents(t *testing.T) {
	enforcing := func(node string, running int) agentpool.AgentState {
		return agentpool.AgentState{Node: node, Ready: true, Connected: true, Capacity: 4, Running: running, EnforcedLimits: []string{"memory", "cpu", "pids"}}
	}
	lacking := func(node string, running int) agentpool.AgentState {
		return agentpool.AgentState{Node: node, Ready: true, Connected: true, Capacity: 4, Running: running, EnforcedLimits: []string{"pids"}}
	}
	tests := map[string]struct {
		task       *bashtaskv1alpha1.BashTask
		candidates []agentpool.AgentState
		want       string
	}{
		"enforcing though busier":     {task: memoryTask(), candidates: []agentpool.AgentState{lacking("idle", 0), enforcing("busy", 3)}, want: "busy"},
		"the enforcing one is full":   {task: memoryTask(), candidates: []agentpool.AgentState{lacking("idle", 0), enforcing("full", 4)}, want: "idle"},
		"none enforces":               {task: memoryTask(), candidates: []agentpool.AgentState{lacking("b", 1), lacking("a", 0)}, want: "a"},
		"no limits: the least loaded": {task: &bashtaskv1alpha1.BashTask{}, candidates: []agentpool.AgentState{lacking("idle", 0), enforcing("busy", 3)}, want: "idle"},
		"the enforcing one is not ready": {task: memoryTask(), candidates: []agentpool.AgentState{lacking("idle", 2), func() agentpool.AgentState {
			a := enforcing("down", 0)
			a.Ready = false
			return a
		}()}, want: "idle"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := placementRequest{what: "the task", notEnforced: func(a *agentpool.AgentState) []bashtaskv1alpha1.ResourceLimitName { return notEnforcedOn(tc.task, a) }}
			pl := chooseEnforcing(p, tc.candidates, nil)
			if pl.agent == nil || pl.agent.Node != tc.want {
				t.Errorf("chose %v (%s), want %s", pl.agent, pl.why, tc.want)
			}
		})
	}
}

// What a node does not enforce is what the task asks for and the agent
// does not list; a disk size for a named working directory never is.
func TestNotEnforcedOn(t *testing.T) {
	all := &agentpool.AgentState{EnforcedLimits: []string{"memory", "cpu", "pids", "ephemeral-storage", "future-limit"}}
	none := &agentpool.AgentState{}
	every := func(bt *bashtaskv1alpha1.BashTask) {
		bt.Spec.Resources.CPU = ptr.To(resource.MustParse("500m"))
		bt.Spec.Resources.PIDs = ptr.To[int64](10)
		bt.Spec.Resources.EphemeralStorage = ptr.To(resource.MustParse("1Gi"))
	}
	namedDir := func(bt *bashtaskv1alpha1.BashTask) { bt.Spec.WorkingDir = ptr.To("/srv") }
	tests := map[string]struct {
		bt    *bashtaskv1alpha1.BashTask
		agent *agentpool.AgentState
		want  []bashtaskv1alpha1.ResourceLimitName
	}{
		"all enforced":   {bt: memoryTask(every), agent: all},
		"none enforced":  {bt: memoryTask(every), agent: none, want: []bashtaskv1alpha1.ResourceLimitName{"memory", "cpu", "pids", "ephemeralStorage"}},
		"named work dir": {bt: memoryTask(every, namedDir), agent: all, want: []bashtaskv1alpha1.ResourceLimitName{"ephemeralStorage"}},
		"no resources":   {bt: &bashtaskv1alpha1.BashTask{}, agent: none},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, notEnforcedOn(tc.bt, tc.agent)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// The status says per limit what the node does not enforce, keeps
// limitsEnforced as the summary and sets the condition only for a task
// that asks for limits.
func TestSetLimitsStatus(t *testing.T) {
	bt := memoryTask()
	bt.Status.NodeName = ptr.To("node-a")
	setLimitsStatus(bt, []bashtaskv1alpha1.ResourceLimitName{bashtaskv1alpha1.LimitMemory})
	if iso := bt.Status.Isolation; iso == nil || ptr.Deref(iso.LimitsEnforced, true) || len(iso.LimitsNotEnforced) != 1 {
		t.Errorf("isolation %+v: want memory not enforced, limitsEnforced false", iso)
	}
	if evs := limitsEvents(&bashtaskv1alpha1.BashTaskStatus{}, bt, "Dispatch"); len(evs) != 1 || evs[0].note != "node node-a does not enforce spec.resources.memory: the task runs without it, unless the agent refuses such tasks (--unenforced-limits=refuse)" {
		t.Errorf("events %+v: want one naming the node and the limit", evs)
	}
	old := bt.Status.DeepCopy()
	setLimitsStatus(bt, nil)
	if !ptr.Deref(bt.Status.Isolation.LimitsEnforced, false) || limitsEvents(old, bt, "Start") != nil {
		t.Errorf("isolation %+v: want limitsEnforced true and no event", bt.Status.Isolation)
	}
	plain := &bashtaskv1alpha1.BashTask{}
	setLimitsStatus(plain, []bashtaskv1alpha1.ResourceLimitName{bashtaskv1alpha1.LimitEphemeralStorage})
	if plain.Status.Isolation.LimitsEnforced != nil || len(plain.Status.Conditions) != 0 {
		t.Errorf("a task without spec.resources: %+v, %+v; want no summary and no condition", plain.Status.Isolation, plain.Status.Conditions)
	}
}
