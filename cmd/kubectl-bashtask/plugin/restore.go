package plugin

import (
	"fmt"
	"time"

	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// restoreNote is the line run prints on stderr for the first task of a
// workspace copy restored from a snapshot (status.workspaceRestore,
// docs/workspaces.md): which node it runs on, how old the snapshot was
// and, after a node loss, which node was lost and that what its tasks
// wrote after the snapshot is gone. "" for any other task.
func restoreNote(bt *bashtaskv1alpha1.BashTask) string {
	n := bt.Status.WorkspaceRestore
	if n == nil {
		return ""
	}
	ws := ptr.Deref(n.Workspace, ptr.Deref(bt.Spec.Workspace, ""))
	node := ptr.Deref(n.NodeName, "another node")
	if lost := ptr.Deref(n.LostNode, ""); lost != "" {
		age := time.Duration(ptr.Deref(n.AgeSeconds, 0)) * time.Second
		if n.LostTime != nil && n.SnapshotTime != nil {
			age = max(n.LostTime.Sub(n.SnapshotTime.Time), 0)
		}
		return fmt.Sprintf("workspace %s was restored on %s from a snapshot taken %s before node %s was lost; changes after it are gone",
			ws, node, age.Round(time.Second), lost)
	}
	taken := "an earlier snapshot"
	if n.SnapshotTime != nil {
		taken = "its snapshot of " + n.SnapshotTime.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("workspace %s was restored on %s from %s (%s old)",
		ws, node, taken, time.Duration(ptr.Deref(n.AgeSeconds, 0))*time.Second)
}
