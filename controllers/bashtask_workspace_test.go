package controllers

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// What a workspace means for a task not yet dispatched: run, wait with a
// message that says what for, or end at once (docs/workspaces.md,
// "BashTask fields").
func TestWorkspaceVerdict(t *testing.T) {
	snap := metav1.NewTime(t0)
	ws := func(phase bashtaskv1alpha1.WorkspacePhase, mutate ...func(*bashtaskv1alpha1.BashWorkspace)) *bashtaskv1alpha1.BashWorkspace {
		w := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w", UID: "wu"}}
		if phase != "" {
			w.Status.Phase = ptr.To(phase)
		}
		for _, m := range mutate {
			m(w)
		}
		return w
	}
	onNode := func(w *bashtaskv1alpha1.BashWorkspace) { w.Status.NodeName = ptr.To("n1") }
	held := func(w *bashtaskv1alpha1.BashWorkspace) { w.Spec.Suspend = ptr.To(true) }
	snapshotted := func(w *bashtaskv1alpha1.BashWorkspace) {
		w.Status.Snapshot = &bashtaskv1alpha1.WorkspaceSnapshotStatus{Time: &snap}
	}
	message := func(m string) func(*bashtaskv1alpha1.BashWorkspace) {
		return func(w *bashtaskv1alpha1.BashWorkspace) { w.Status.Message = ptr.To(m) }
	}
	tests := map[string]struct {
		ws       *bashtaskv1alpha1.BashWorkspace
		wantRun  bool
		wantWait string
		wantEnd  bashtaskv1alpha1.Reason
		wantMsg  []string
	}{
		"not found": {
			wantWait: ReasonWorkspaceNotFound, wantMsg: []string{`BashWorkspace "w" not found in namespace ns`},
		},
		"Ready": {ws: ws(bashtaskv1alpha1.WorkspaceReady, onNode), wantRun: true},
		"new": {
			ws: ws(""), wantWait: ReasonWorkspaceNotReady, wantMsg: []string{"not placed on a node yet"},
		},
		"Pending, being placed": {
			ws: ws(bashtaskv1alpha1.WorkspacePending, message("no ready agent with free capacity on any node; retrying")), wantWait: ReasonWorkspaceNotReady,
			wantMsg: []string{`"w" is Pending: no ready agent with free capacity on any node`, "starts once it is Ready"},
		},
		"Pending, being restored": {
			ws: ws(bashtaskv1alpha1.WorkspacePending, onNode, snapshotted, message("being restored on node n1 from its snapshot of 2026-01-02T03:04:05Z")), wantWait: ReasonWorkspaceNotReady,
			wantMsg: []string{"being restored on node n1 from its snapshot of 2026-01-02T03:04:05Z"},
		},
		"Suspended by its idle timeout: the task restores it": {
			ws: ws(bashtaskv1alpha1.WorkspaceSuspended, snapshotted), wantWait: ReasonWorkspaceNotReady,
			wantMsg: []string{"Suspended to its snapshot of 2026-01-02T03:04:05Z", "this task restores it", "placed on a node and restored"},
		},
		"Suspended, its copy still being released": {
			ws: ws(bashtaskv1alpha1.WorkspaceSuspended, snapshotted, onNode), wantWait: ReasonWorkspaceNotReady,
			wantMsg: []string{"this task restores it", "after its copy on node n1 is released"},
		},
		"held by spec.suspend, Suspended": {
			ws: ws(bashtaskv1alpha1.WorkspaceSuspended, snapshotted, held), wantEnd: bashtaskv1alpha1.ReasonWorkspaceUnavailable,
			wantMsg: []string{`BashWorkspace "w" is held by its spec.suspend`, "the task was not started", "kubectl bashtask workspace resume w", "set its spec.suspend to false"},
		},
		"held by spec.suspend, still Ready": {
			ws: ws(bashtaskv1alpha1.WorkspaceReady, onNode, held), wantEnd: bashtaskv1alpha1.ReasonWorkspaceUnavailable,
			wantMsg: []string{"held by its spec.suspend"},
		},
		"NodeLost": {
			ws: ws(bashtaskv1alpha1.WorkspaceNodeLost, message("node n1 was deleted")), wantEnd: bashtaskv1alpha1.ReasonWorkspaceUnavailable,
			wantMsg: []string{`"w" is NodeLost (node n1 was deleted)`, "takes no more tasks"},
		},
		"Failed": {
			ws: ws(bashtaskv1alpha1.WorkspaceFailed, message("the agent refused it")), wantEnd: bashtaskv1alpha1.ReasonWorkspaceUnavailable,
			wantMsg: []string{"is Failed (the agent refused it)"},
		},
		"being deleted": {
			ws: ws(bashtaskv1alpha1.WorkspaceReady, onNode, func(w *bashtaskv1alpha1.BashWorkspace) { w.DeletionTimestamp = &snap }), wantEnd: bashtaskv1alpha1.ReasonCancelled,
			wantMsg: []string{"being deleted"},
		},
		"another owner": {
			ws: ws(bashtaskv1alpha1.WorkspaceReady, onNode, func(w *bashtaskv1alpha1.BashWorkspace) { w.Spec.Owner = ptr.To("bob") }), wantEnd: bashtaskv1alpha1.ReasonInvalidSpec,
			wantMsg: []string{`owner "bob"`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"}, Spec: bashtaskv1alpha1.BashTaskSpec{Workspace: ptr.To("w")}}
			got := workspaceVerdict(bt, tc.ws)
			if (got.target != nil) != tc.wantRun || got.wait != tc.wantWait || got.end != tc.wantEnd {
				t.Fatalf("verdict: run %t, wait %q, end %q; want run %t, wait %q, end %q (message %q)",
					got.target != nil, got.wait, got.end, tc.wantRun, tc.wantWait, tc.wantEnd, got.message)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(got.message, w) {
					t.Errorf("message does not say %q: %s", w, got.message)
				}
			}
		})
	}
}

// A Suspended workspace's message says what restores it: its next task,
// or a resume while spec.suspend holds it.
func TestSuspendedNote(t *testing.T) {
	ws := &bashtaskv1alpha1.BashWorkspace{}
	ws.Status.Message = ptr.To("idle for 60s (spec.idleTimeoutSeconds): suspended to its snapshot of T")
	suspendedNote(ws)
	if got := *ws.Status.Message; !strings.HasSuffix(got, "its next task restores it on a node") {
		t.Errorf("idle suspend: %s", got)
	}
	ws.Spec.Suspend = ptr.To(true)
	suspendedNote(ws)
	want := "idle for 60s (spec.idleTimeoutSeconds): suspended to its snapshot of T; spec.suspend holds it: a task naming it is refused until it is resumed (kubectl bashtask workspace resume, or spec.suspend set to false)"
	if got := *ws.Status.Message; got != want {
		t.Errorf("held:\n got %s\nwant %s", got, want)
	}
}
