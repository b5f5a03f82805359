package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// The restore notice (docs/workspaces.md, "Snapshots"): the first task
// dispatched to a copy of a workspace restored from a snapshot carries,
// in status.workspaceRestore and the condition WorkspaceRestored, which
// snapshot the copy came from, how old it was and which node was lost,
// so that whoever reads the task's result learns that the files may be
// older than the last task they ran. Exactly one task per restore: the
// task claims the notice on the workspace (status.restoredFrom.firstTask)
// in a status write conditional on the workspace's resourceVersion, so
// two tasks dispatched at once cannot both claim it.

// restoreNotice claims the restore notice of the workspace's current
// copy for bt, when the copy was restored and no other task has claimed
// it, and puts it into bt's status before its write-ahead. A claim lost
// to another writer of the workspace is a conflict: the pass is retried
// from fresh state. target is the workspace checkWorkspace found Ready.
func (r *BashTaskReconciler) restoreNotice(ctx context.Context, bt *bashtaskv1alpha1.BashTask, target *workspaceTarget) error {
	if target == nil || bt.Status.WorkspaceRestore != nil {
		return nil
	}
	ws := &bashtaskv1alpha1.BashWorkspace{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: bt.Namespace, Name: target.ref.GetName()}, ws); err != nil {
		return fmt.Errorf("reading workspace %s of %s: %w", target.ref.GetName(), klog.KObj(bt), err)
	}
	rf := ws.Status.RestoredFrom
	if rf == nil || rf.RestoreTime == nil || ptr.Deref(ws.Status.Epoch, 0) != target.ref.GetEpoch() {
		return nil // a copy made empty, or another copy than the one the task goes to
	}
	switch first := ptr.Deref(rf.FirstTask, ""); {
	case first == "":
		rf.FirstTask = ptr.To(bt.Name)
		if err := r.leading("status"); err != nil {
			return fmt.Errorf("claiming the restore notice of workspace %s: %w", klog.KObj(ws), err)
		}
		if err := r.client.Status().Update(ctx, ws); err != nil {
			return fmt.Errorf("claiming the restore notice of workspace %s: %w", klog.KObj(ws), err)
		}
	case first != bt.Name:
		return nil // an earlier task has it
	}
	n := restoreNoticeOf(ws)
	bt.Status.WorkspaceRestore = n
	setCondition(bt, bashtaskv1alpha1.ConditionWorkspaceRestored, true, bashtaskv1alpha1.ReasonRestoredFromSnapshot, restoreSentence(n))
	return nil
}

// restoreNoticeOf is the notice of ws's current copy, from its
// status.restoredFrom.
func restoreNoticeOf(ws *bashtaskv1alpha1.BashWorkspace) *bashtaskv1alpha1.WorkspaceRestoreNotice {
	rf := ws.Status.RestoredFrom
	return &bashtaskv1alpha1.WorkspaceRestoreNotice{
		Workspace: ptr.To(ws.Name), NodeName: ws.Status.NodeName, URL: rf.URL,
		SnapshotTime: rf.SnapshotTime, RestoreTime: rf.RestoreTime, AgeSeconds: rf.AgeSeconds,
		LostNode: rf.LostNode, LostTime: rf.LostTime,
	}
}

// restoreSentence is the notice in a sentence, the condition's message.
func restoreSentence(n *bashtaskv1alpha1.WorkspaceRestoreNotice) string {
	taken := "an unknown time"
	if n.SnapshotTime != nil {
		taken = n.SnapshotTime.UTC().Format(time.RFC3339)
	}
	s := fmt.Sprintf("workspace %s was restored on node %s from its snapshot of %s (%s old)",
		ptr.Deref(n.Workspace, ""), ptr.Deref(n.NodeName, ""), taken, time.Duration(ptr.Deref(n.AgeSeconds, 0))*time.Second)
	if lost := ptr.Deref(n.LostNode, ""); lost != "" {
		s += fmt.Sprintf(" after node %s was lost: what its tasks wrote after the snapshot is gone", lost)
	}
	return s
}
