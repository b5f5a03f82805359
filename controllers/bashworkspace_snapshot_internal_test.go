package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// The after-task snapshot's decision: due delay after the last task's
// end, only when a task ended since the last snapshot (and since the
// copy's restore), never while a task runs.
func TestSnapshotDueAfterTask(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(s int) *metav1.Time { return ptr.To(metav1.NewTime(t0.Add(time.Duration(s) * time.Second))) }
	snap := func(s int) *bashtaskv1alpha1.WorkspaceSnapshotStatus {
		return &bashtaskv1alpha1.WorkspaceSnapshotStatus{Time: at(s)}
	}
	const delay = 60 * time.Second
	for _, tc := range []struct {
		name        string
		st          bashtaskv1alpha1.BashWorkspaceStatus
		now         int
		wantChanged bool
		wantWait    time.Duration
	}{
		{"no task yet", bashtaskv1alpha1.BashWorkspaceStatus{}, 100, false, 0},
		{"a task ended, never snapshotted, not due", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(10)}, 30, true, 40 * time.Second},
		{"a task ended, never snapshotted, due", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(10)}, 70, true, 0},
		{"long overdue", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(10)}, 1000, true, 0},
		{"a task runs", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(10), RunningTasks: ptr.To[int32](1)}, 1000, false, 0},
		{"snapshotted after the last task", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(10), Snapshot: snap(70)}, 1000, false, 0},
		{"a task ended after the snapshot", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(100), Snapshot: snap(70)}, 130, true, 30 * time.Second},
		{"the same second as the snapshot counts", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(70), Snapshot: snap(70)}, 200, true, 0},
		{"restored since the last task", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(100), Snapshot: snap(70),
			RestoredFrom: &bashtaskv1alpha1.WorkspaceRestoreStatus{RestoreTime: at(150)}}, 1000, false, 0},
		{"a task on the restored copy", bashtaskv1alpha1.BashWorkspaceStatus{LastTaskTime: at(200), Snapshot: snap(70),
			RestoredFrom: &bashtaskv1alpha1.WorkspaceRestoreStatus{RestoreTime: at(150)}}, 230, true, 30 * time.Second},
	} {
		changed, wait := snapshotDueAfterTask(&tc.st, delay, t0.Add(time.Duration(tc.now)*time.Second))
		if changed != tc.wantChanged || wait != tc.wantWait {
			t.Errorf("%s: changed %v, wait %v; want %v, %v", tc.name, changed, wait, tc.wantChanged, tc.wantWait)
		}
	}
}

// capsAgents is a WorkspaceAgents whose every agent reports caps; it
// answers nothing else.
type capsAgents struct {
	WorkspaceAgents
	caps []string
}

func (a capsAgents) Agent(node string) agentpool.AgentState {
	return agentpool.AgentState{Node: node, Connected: true, Capabilities: a.caps}
}

// A Ready workspace whose agent cannot snapshot says so in its message;
// one whose agent can does not.
func TestNoteNoSnapshots(t *testing.T) {
	for _, tc := range []struct {
		caps []string
		want string
	}{
		{[]string{"workspaces"}, "ready on node n1" + noSnapshots},
		{[]string{"workspaces", "snapshots"}, "ready on node n1"},
	} {
		ws := &bashtaskv1alpha1.BashWorkspace{}
		ws.Status.NodeName = ptr.To("n1")
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceReady, "ready on node n1")
		r := &BashWorkspaceReconciler{agents: capsAgents{caps: tc.caps}}
		r.noteNoSnapshots(ws)
		if got := ptr.Deref(ws.Status.Message, ""); got != tc.want {
			t.Errorf("capabilities %v: message %q, want %q", tc.caps, got, tc.want)
		}
	}
}
