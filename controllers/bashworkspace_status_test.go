package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestWorkspaceSpec(t *testing.T) {
	tests := map[string]struct {
		spec bashtaskv1alpha1.BashWorkspaceSpec
		want *agentv1.WorkspaceSpec
	}{
		"defaults": {
			want: &agentv1.WorkspaceSpec{CarryWorkingDir: true},
		},
		"every field": {
			spec: bashtaskv1alpha1.BashWorkspaceSpec{
				Owner: ptr.To("s1"), Storage: ptr.To(resource.MustParse("1Gi")), Network: ptr.To(bashtaskv1alpha1.NetworkNone),
				CarryOver: &bashtaskv1alpha1.CarryOver{WorkingDir: ptr.To(false), Environment: ptr.To(true)},
			},
			want: &agentv1.WorkspaceSpec{StorageBytes: 1 << 30, Network: "None", CarryEnv: true, Owner: "s1"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w", UID: "u1"}, Spec: tc.spec}
			tc.want.Ref = &agentv1.WorkspaceRef{Namespace: "ns", Name: "w", Uid: "u1"}
			got := workspaceSpec(ws)
			if diff := cmp.Diff(tc.want.String(), got.String()); diff != "" {
				t.Errorf("workspaceSpec (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplyWorkspaceStatus(t *testing.T) {
	end := time.Date(2026, 1, 2, 3, 4, 5, 678000000, time.UTC)
	tests := map[string]struct {
		in          *agentv1.WorkspaceStatus
		before      *metav1.Time
		want        bashtaskv1alpha1.BashWorkspaceStatus
		wantMessage string
	}{
		"capped": {
			in: &agentv1.WorkspaceStatus{RunAsUser: 2000001, Path: "/home/task", WorkingDir: "/home/task/src", UsedBytes: 4096, CapacityBytes: 1 << 30,
				StorageEnforced: true, RunningTasks: 2, Network: "None", LastTaskEnd: timestamppb.New(end), LastTaskName: "t1", LastTaskUid: "u1"},
			want: bashtaskv1alpha1.BashWorkspaceStatus{RunAsUser: ptr.To[int64](2000001), Path: ptr.To("/home/task"), WorkingDir: ptr.To("/home/task/src"),
				UsedBytes: ptr.To[int64](4096), CapacityBytes: ptr.To[int64](1 << 30), RunningTasks: ptr.To[int32](2), Network: ptr.To(bashtaskv1alpha1.NetworkNone),
				LastTaskTime: ptr.To(metav1.NewTime(end.Truncate(time.Second))), LastTask: ptr.To("t1")},
			wantMessage: "ready on node n1",
		},
		"not capped": {
			in: &agentv1.WorkspaceStatus{RunAsUser: 7, Path: "/home/task", WorkingDir: "/home/task", CarryMessage: "the directory /home/task/x is gone", UsedBytes: 0},
			want: bashtaskv1alpha1.BashWorkspaceStatus{RunAsUser: ptr.To[int64](7), Path: ptr.To("/home/task"), WorkingDir: ptr.To("/home/task"),
				CarryMessage: ptr.To("the directory /home/task/x is gone"), RunningTasks: ptr.To[int32](0)},
			wantMessage: "ready on node n1" + noStorageCap,
		},
		"an earlier end does not move lastTaskTime back": {
			in:          &agentv1.WorkspaceStatus{LastTaskEnd: timestamppb.New(end), StorageEnforced: true},
			before:      ptr.To(metav1.NewTime(end.Add(time.Hour))),
			want:        bashtaskv1alpha1.BashWorkspaceStatus{RunAsUser: ptr.To[int64](0), UsedBytes: ptr.To[int64](0), CapacityBytes: ptr.To[int64](0), RunningTasks: ptr.To[int32](0), LastTaskTime: ptr.To(metav1.NewTime(end.Add(time.Hour)))},
			wantMessage: "ready on node n1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ws := &bashtaskv1alpha1.BashWorkspace{Status: bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: tc.before}}
			applyWorkspaceStatus(ws, tc.in, "n1")
			tc.want.NodeName = ptr.To("n1")
			tc.want.Phase = ptr.To(bashtaskv1alpha1.WorkspaceReady)
			tc.want.Message = ptr.To(tc.wantMessage)
			if diff := cmp.Diff(tc.want, ws.Status); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}

// The kstatus conditions follow the phase: never Reconciling and Stalled
// together, Ready only when Ready.
func TestSetWorkspaceConditions(t *testing.T) {
	type cond struct{ status, reason string }
	tests := map[bashtaskv1alpha1.WorkspacePhase]map[string]cond{
		"": {
			bashtaskv1alpha1.ConditionReady:       {"False", bashtaskv1alpha1.WorkspaceReasonPending},
			bashtaskv1alpha1.ConditionReconciling: {"True", bashtaskv1alpha1.WorkspaceReasonPending},
		},
		bashtaskv1alpha1.WorkspaceReady: {bashtaskv1alpha1.ConditionReady: {"True", bashtaskv1alpha1.WorkspaceReasonReady}},
		bashtaskv1alpha1.WorkspaceTerminating: {
			bashtaskv1alpha1.ConditionReady:       {"False", bashtaskv1alpha1.WorkspaceReasonTerminating},
			bashtaskv1alpha1.ConditionReconciling: {"True", bashtaskv1alpha1.WorkspaceReasonTerminating},
		},
		bashtaskv1alpha1.WorkspaceNodeLost: {
			bashtaskv1alpha1.ConditionReady:   {"False", bashtaskv1alpha1.WorkspaceReasonNodeLost},
			bashtaskv1alpha1.ConditionStalled: {"True", bashtaskv1alpha1.WorkspaceReasonNodeLost},
		},
		bashtaskv1alpha1.WorkspaceFailed: {
			bashtaskv1alpha1.ConditionReady:   {"False", bashtaskv1alpha1.WorkspaceReasonInvalidSpec},
			bashtaskv1alpha1.ConditionStalled: {"True", bashtaskv1alpha1.WorkspaceReasonInvalidSpec},
		},
	}
	for phase, want := range tests {
		t.Run(string(phase), func(t *testing.T) {
			// From every other phase's conditions, so stale ones must go.
			ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
			for _, c := range []string{bashtaskv1alpha1.ConditionReady, bashtaskv1alpha1.ConditionReconciling, bashtaskv1alpha1.ConditionStalled} {
				meta.SetStatusCondition(&ws.Status.Conditions, metav1.Condition{Type: c, Status: metav1.ConditionUnknown, Reason: "Old"})
			}
			if phase != "" {
				ws.Status.Phase = ptr.To(phase)
			}
			setWorkspaceConditions(ws)
			got := map[string]cond{}
			for _, c := range ws.Status.Conditions {
				got[c.Type] = cond{string(c.Status), c.Reason}
				if c.ObservedGeneration != 3 {
					t.Errorf("condition %s: observedGeneration %d, want 3", c.Type, c.ObservedGeneration)
				}
			}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(cond{})); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOwnerMismatch(t *testing.T) {
	tests := map[string]struct {
		task, workspace *string
		want            string // empty: allowed
	}{
		"no owner anywhere":     {},
		"open workspace":        {task: ptr.To("bob")},
		"same owner":            {task: ptr.To("alice"), workspace: ptr.To("alice")},
		"another owner":         {task: ptr.To("bob"), workspace: ptr.To("alice"), want: `spec.owner "bob" differs from the owner "alice" of BashWorkspace "w": only that owner's tasks run in it`},
		"task without an owner": {workspace: ptr.To("alice"), want: `spec.owner is unset, and BashWorkspace "w" belongs to owner "alice": only that owner's tasks run in it`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt := &bashtaskv1alpha1.BashTask{Spec: bashtaskv1alpha1.BashTaskSpec{Owner: tc.task}}
			ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Name: "w"}, Spec: bashtaskv1alpha1.BashWorkspaceSpec{Owner: tc.workspace}}
			if got := ownerMismatch(bt, ws); got != tc.want {
				t.Errorf("ownerMismatch = %q, want %q", got, tc.want)
			}
		})
	}
}

// agentList is a fixed set of agents for chooseAgent.
type agentList []agentpool.AgentState

func (l agentList) Agents() []agentpool.AgentState { return append([]agentpool.AgentState(nil), l...) }
func (l agentList) Agent(node string) agentpool.AgentState {
	for _, a := range l {
		if a.Node == node {
			return a
		}
	}
	return agentpool.AgentState{Node: node}
}

// A workspace goes to a ready agent at the tenant level that serves
// workspaces, the one holding the fewest, whatever its running tasks.
func TestPlaceWorkspace(t *testing.T) {
	serving := func(node string, running int) agentpool.AgentState {
		return agentpool.AgentState{Node: node, Ready: true, Connected: true, Isolation: "tenant", Capabilities: []string{"workspaces"}, Capacity: 2, Running: running}
	}
	process := agentpool.AgentState{Node: "p", Ready: true, Connected: true, Isolation: "process", Capacity: 2}
	old := agentpool.AgentState{Node: "o", Ready: true, Connected: true, Isolation: "tenant", Capacity: 2}
	tests := map[string]struct {
		agents   agentList
		load     map[string]int
		nodeName string
		want     string // the node, or a substring of why
	}{
		"fewest workspaces":        {agents: agentList{serving("a", 0), serving("b", 1)}, load: map[string]int{"a": 3, "b": 1}, want: "b"},
		"then fewest tasks":        {agents: agentList{serving("a", 1), serving("b", 0)}, want: "b"},
		"a full agent takes one":   {agents: agentList{serving("a", 2)}, want: "a"},
		"process level never":      {agents: agentList{process, old}, want: "needs an agent at the tenant isolation level"},
		"the named node":           {agents: agentList{serving("a", 0), serving("b", 0)}, nodeName: "b", want: "b"},
		"a named node not there":   {agents: agentList{serving("a", 0)}, nodeName: "z", want: "no agent has reported from node z"},
		"serving one among others": {agents: agentList{process, serving("c", 1), old}, want: "c"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			candidates := tc.agents.Agents()
			if tc.nodeName != "" {
				candidates = []agentpool.AgentState{tc.agents.Agent(tc.nodeName)}
			}
			pl := chooseAgent(placementRequest{
				what: "the workspace", nodeName: tc.nodeName, workspace: true, anyCapacity: true,
				load: func(a *agentpool.AgentState) int { return tc.load[a.Node] },
			}, candidates, nil)
			a, why, invalid := pl.agent, pl.why, pl.invalid
			if invalid != "" {
				t.Fatalf("invalid = %q", invalid)
			}
			got := why
			if a != nil {
				got = a.Node
			}
			if a != nil && got != tc.want || a == nil && !strings.Contains(got, tc.want) {
				t.Errorf("placed on %q, want %q", got, tc.want)
			}
		})
	}
}
