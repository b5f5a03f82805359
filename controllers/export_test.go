package controllers

import "context"

// WorkspacesOn is the reconciler's count of the workspaces placed on
// node, as placement ranks agents by it.
func WorkspacesOn(ctx context.Context, r *BashWorkspaceReconciler, node string) int {
	return r.workspacesOn(ctx, node)
}
