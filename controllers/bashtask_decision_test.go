package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

var decisionOpts = cmp.AllowUnexported(taskDecision{}, taskEvent{}, finishPlan{})

// t0 is the decision tests' fixed "now".
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func dispatchedTask(phase bashtaskv1alpha1.Phase) *bashtaskv1alpha1.BashTask {
	return &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t", UID: "u1"},
		Status: bashtaskv1alpha1.BashTaskStatus{
			NodeName: ptr.To("n1"), Agent: &bashtaskv1alpha1.AgentRef{Incarnation: ptr.To("i1")}, Phase: ptr.To(phase),
		},
	}
}

func TestReportDecision(t *testing.T) {
	const delay, interval = 500 * time.Millisecond, 5 * time.Second
	resync := reconcile.Result{RequeueAfter: runningResync}
	running := func(bt *bashtaskv1alpha1.BashTask) {
		bt.Status.Phase = ptr.To(bashtaskv1alpha1.PhaseRunning)
		bt.Status.Stdout = &bashtaskv1alpha1.StreamStatus{Tail: ptr.To("more")}
	}
	tests := map[string]struct {
		was    bashtaskv1alpha1.Phase
		report func(bt *bashtaskv1alpha1.BashTask)
		times  reportTimes
		want   taskDecision
	}{
		"first Running held back within the delay": {
			was: bashtaskv1alpha1.PhasePending, report: running,
			times: reportTimes{now: t0, started: t0.Add(-100 * time.Millisecond), dispatched: true},
			want:  taskDecision{result: reconcile.Result{RequeueAfter: 400 * time.Millisecond}},
		},
		"first Running written after the delay, with Started": {
			was: bashtaskv1alpha1.PhasePending, report: running,
			times: reportTimes{now: t0, started: t0.Add(-time.Second), dispatched: true},
			want: taskDecision{write: "running", progress: true, result: resync,
				events: []taskEvent{{"Normal", ReasonStarted, "Start", "Started on node n1"}}},
		},
		"dispatched by another process: written at once": {
			was: bashtaskv1alpha1.PhasePending, report: running,
			times: reportTimes{now: t0},
			want: taskDecision{write: "running", progress: true, result: resync,
				events: []taskEvent{{"Normal", ReasonStarted, "Start", "Started on node n1"}}},
		},
		"progress throttled": {
			was: bashtaskv1alpha1.PhaseRunning, report: running,
			times: reportTimes{now: t0, lastProgress: t0.Add(-2 * time.Second), progressWritten: true},
			want:  taskDecision{result: reconcile.Result{RequeueAfter: 3 * time.Second}},
		},
		"progress written after the interval, no event": {
			was: bashtaskv1alpha1.PhaseRunning, report: running,
			times: reportTimes{now: t0, lastProgress: t0.Add(-6 * time.Second), progressWritten: true},
			want:  taskDecision{write: "progress", progress: true, result: resync},
		},
		"nothing changed": {
			was: bashtaskv1alpha1.PhaseRunning, report: func(*bashtaskv1alpha1.BashTask) {},
			times: reportTimes{now: t0},
			want:  taskDecision{result: resync},
		},
		"short success: no event": {
			was: bashtaskv1alpha1.PhasePending,
			report: func(bt *bashtaskv1alpha1.BashTask) {
				setTerminal(bt, bashtaskv1alpha1.ReasonSucceeded, "ok", t0)
			},
			times: reportTimes{now: t0, started: t0, dispatched: true},
			want:  taskDecision{write: "terminal", finished: true},
		},
		"success after Running: event": {
			was: bashtaskv1alpha1.PhaseRunning,
			report: func(bt *bashtaskv1alpha1.BashTask) {
				setTerminal(bt, bashtaskv1alpha1.ReasonSucceeded, "ok", t0)
			},
			times: reportTimes{now: t0},
			want: taskDecision{write: "terminal", finished: true,
				events: []taskEvent{{"Normal", string(bashtaskv1alpha1.ReasonSucceeded), "Finish", "on node n1: ok"}}},
		},
		"failure: event even when short": {
			was: bashtaskv1alpha1.PhasePending,
			report: func(bt *bashtaskv1alpha1.BashTask) {
				setTerminal(bt, bashtaskv1alpha1.ReasonNonZeroExit, "exit 1", t0)
			},
			times: reportTimes{now: t0, started: t0, dispatched: true},
			want: taskDecision{write: "terminal", finished: true,
				events: []taskEvent{{"Warning", string(bashtaskv1alpha1.ReasonNonZeroExit), "Finish", "on node n1: exit 1"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt := dispatchedTask(tc.was)
			old := bt.Status.DeepCopy()
			tc.report(bt)
			got := reportDecision(bt, old, tc.times, delay, interval)
			if diff := cmp.Diff(tc.want, got, decisionOpts); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanFinish(t *testing.T) {
	done := metav1.NewTime(t0.Add(-10 * time.Second))
	task := func(ttl *int32, deleting bool) *bashtaskv1alpha1.BashTask {
		bt := dispatchedTask(bashtaskv1alpha1.PhaseSucceeded)
		bt.Spec.TTLSecondsAfterFinished = ttl
		bt.Status.CompletionTime = &done
		if deleting {
			bt.DeletionTimestamp = &done
		}
		return bt
	}
	tests := map[string]struct {
		bt       *bashtaskv1alpha1.BashTask
		state    finishState
		want     finishPlan
		wantWait time.Duration
	}{
		"kept, no TTL":                 {bt: task(nil, false), want: finishPlan{agent: finishNone}},
		"forgotten when held":          {bt: task(nil, false), state: finishState{held: true}, want: finishPlan{agent: finishForget}},
		"cancelled when still running": {bt: task(ptr.To[int32](0), true), state: finishState{held: true, running: true}, want: finishPlan{agent: finishCancel}},
		"deleted: finalizer released":  {bt: task(ptr.To[int32](0), true), state: finishState{held: true}, want: finishPlan{agent: finishForget, removeFinalizer: true}},
		"TTL not yet due":              {bt: task(ptr.To[int32](60), false), wantWait: 50 * time.Second},
		"TTL due":                      {bt: task(ptr.To[int32](5), false), want: finishPlan{ttlDue: true, ttl: 5}},
		"default TTL applies":          {bt: task(nil, false), state: finishState{defaultTTL: ptr.To[int32](1)}, want: finishPlan{ttlDue: true, ttl: 1}},
		"spec TTL wins over default":   {bt: task(ptr.To[int32](20), false), state: finishState{defaultTTL: ptr.To[int32](1)}, wantWait: 10 * time.Second},
		// The status, and the record kept of it, must say where the output
		// went before the object goes.
		"TTL due waits for the upload":  {bt: task(ptr.To[int32](5), false), state: finishState{uploading: true}, wantWait: uploadWait},
		"deletion waits for the upload": {bt: task(ptr.To[int32](0), true), state: finishState{uploading: true}, wantWait: uploadWait},
		"deletion waits for the upload, not forever": {bt: func() *bashtaskv1alpha1.BashTask {
			bt := task(ptr.To[int32](0), true)
			bt.DeletionTimestamp = ptr.To(metav1.NewTime(t0.Add(-RecordGiveUpAfter)))
			return bt
		}(), state: finishState{uploading: true}, want: finishPlan{removeFinalizer: true}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.state.now = t0
			got, wait := planFinish(tc.bt, tc.state)
			if diff := cmp.Diff(tc.want, got, decisionOpts); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if wait != tc.wantWait {
				t.Errorf("wait = %s, want %s", wait, tc.wantWait)
			}
		})
	}
}

func TestPendingGates(t *testing.T) {
	retry := 2 * time.Second
	agent := &agentpool.AgentState{Node: "n1"}
	tests := map[string]struct {
		gate       func(bt *bashtaskv1alpha1.BashTask) *taskDecision
		want       *taskDecision
		wantReason bashtaskv1alpha1.Reason
		wantPhase  bashtaskv1alpha1.Phase
	}{
		"cancel before dispatch": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				bt.Spec.CancelRequested = ptr.To(true)
				bt.Spec.Suspend = ptr.To(true)
				return specGate(bt, t0)
			},
			want: &taskDecision{write: "terminal"}, wantReason: bashtaskv1alpha1.ReasonCancelled, wantPhase: bashtaskv1alpha1.PhaseFailed,
		},
		"suspended": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				bt.Spec.Suspend = ptr.To(true)
				return specGate(bt, t0)
			},
			want: &taskDecision{write: "pending"}, wantPhase: bashtaskv1alpha1.PhasePending,
		},
		"neither": {gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision { return specGate(bt, t0) }},
		"network refused everywhere": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return placementGate(bt, placement{reason: ReasonNoAgent, why: "no", invalid: "no"}, t0, retry)
			},
			want: &taskDecision{write: "terminal"}, wantReason: bashtaskv1alpha1.ReasonInvalidSpec, wantPhase: bashtaskv1alpha1.PhaseFailed,
		},
		"no agent: wait": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return placementGate(bt, placement{reason: ReasonNoAgent, why: "none"}, t0, retry)
			},
			want: &taskDecision{write: "pending", result: reconcile.Result{RequeueAfter: retry}}, wantPhase: bashtaskv1alpha1.PhasePending,
		},
		"placed": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return placementGate(bt, placement{agent: agent}, t0, retry)
			},
		},
		"workspace gone": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return workspaceGate(bt, workspaceCheck{end: bashtaskv1alpha1.ReasonCancelled, message: "deleted"}, t0)
			},
			want: &taskDecision{write: "terminal"}, wantReason: bashtaskv1alpha1.ReasonCancelled, wantPhase: bashtaskv1alpha1.PhaseFailed,
		},
		"workspace not ready": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return workspaceGate(bt, workspaceCheck{wait: ReasonWorkspaceNotReady, message: "later"}, t0)
			},
			want: &taskDecision{write: "pending", result: reconcile.Result{RequeueAfter: runningResync}}, wantPhase: bashtaskv1alpha1.PhasePending,
		},
		"missing reference: wait, one event": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return resolveGate(bt, bt.Status.DeepCopy(), &missingReferenceError{field: "spec.stdinFrom", kind: "Secret", name: "s", objectMissing: true}, t0, retry)
			},
			want: &taskDecision{write: "pending", result: reconcile.Result{RequeueAfter: retry}, events: []taskEvent{{
				"Warning", ReasonMissingReference, "Resolve", `spec.stdinFrom: Secret "s" not found; waiting for it to be created`}}},
			wantPhase: bashtaskv1alpha1.PhasePending,
		},
		"invalid value": {
			gate: func(bt *bashtaskv1alpha1.BashTask) *taskDecision {
				return resolveGate(bt, bt.Status.DeepCopy(), &invalidValueError{"bad"}, t0, retry)
			},
			want: &taskDecision{write: "terminal"}, wantReason: bashtaskv1alpha1.ReasonInvalidSpec, wantPhase: bashtaskv1alpha1.PhaseFailed,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t", UID: "u1"}}
			got := tc.gate(bt)
			if diff := cmp.Diff(tc.want, got, decisionOpts); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if r := reasonOf(&bt.Status); r != tc.wantReason {
				t.Errorf("reason = %q, want %q", r, tc.wantReason)
			}
			if p := phaseOf(&bt.Status); p != tc.wantPhase {
				t.Errorf("phase = %q, want %q", p, tc.wantPhase)
			}
		})
	}
}

func TestUnreachableDecision(t *testing.T) {
	bt := dispatchedTask(bashtaskv1alpha1.PhaseRunning)
	got := unreachableDecision(bt, agentpool.AgentState{Node: "n1", UnreachableFor: 20 * time.Second}, time.Minute, t0)
	if diff := cmp.Diff(taskDecision{result: reconcile.Result{RequeueAfter: 40 * time.Second}}, got, decisionOpts); diff != "" {
		t.Errorf("before --agent-lost-after (-want +got):\n%s", diff)
	}
	if isTerminal(bt) {
		t.Fatalf("ended before --agent-lost-after: %s", reasonOf(&bt.Status))
	}
	got = unreachableDecision(bt, agentpool.AgentState{Node: "n1", UnreachableFor: time.Minute}, time.Minute, t0)
	want := taskDecision{write: "terminal", events: []taskEvent{{"Warning", string(bashtaskv1alpha1.ReasonAgentLost), "Follow", "Agent on node n1 lost"}}}
	if diff := cmp.Diff(want, got, decisionOpts); diff != "" {
		t.Errorf("after --agent-lost-after (-want +got):\n%s", diff)
	}
	if reasonOf(&bt.Status) != bashtaskv1alpha1.ReasonAgentLost {
		t.Errorf("reason = %q, want AgentLost", reasonOf(&bt.Status))
	}
}
