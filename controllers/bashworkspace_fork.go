package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// forkPending reports whether ws is a fork not made yet: spec.source set
// and no copy of it ever made (no forkedFrom, no snapshot of its own).
func forkPending(ws *bashtaskv1alpha1.BashWorkspace) bool {
	return ws.Spec.Source != nil && ws.Status.ForkedFrom == nil && ws.Status.Snapshot == nil
}

// forkSource reads the source of the fork ws and checks the rules of
// docs/workspaces.md ("Forking a workspace"): the source exists in the
// namespace, has the fork's owner, and is Ready on a node or Suspended
// with a snapshot. refusal is the reason the fork fails for good; wait,
// when set, says why it waits (the source is being made); err is an
// error to retry.
func (r *BashWorkspaceReconciler) forkSource(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) (src *bashtaskv1alpha1.BashWorkspace, refusal, wait string, err error) {
	name := ws.Spec.Source.Workspace
	src = &bashtaskv1alpha1.BashWorkspace{}
	if err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: ws.Namespace, Name: name}, src); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("spec.source.workspace %q: no BashWorkspace of that name in namespace %s", name, ws.Namespace), "", nil
		}
		return nil, "", "", err
	}
	if src.UID == ws.UID {
		return nil, "spec.source.workspace names the workspace itself", "", nil
	}
	if so, fo := ptr.Deref(src.Spec.Owner, ""), ptr.Deref(ws.Spec.Owner, ""); so != fo {
		return nil, fmt.Sprintf("spec.source.workspace %q is owned by %s, the fork by %s: only the source's owner may fork it", name, ownerName(so), ownerName(fo)), "", nil
	}
	switch phase := workspacePhaseOf(&src.Status); {
	case !src.DeletionTimestamp.IsZero():
		return nil, fmt.Sprintf("spec.source.workspace %q is being deleted", name), "", nil
	case phase == bashtaskv1alpha1.WorkspaceReady && ptr.Deref(src.Status.NodeName, "") != "":
		return src, "", "", nil
	case phase == bashtaskv1alpha1.WorkspaceSuspended && src.Status.Snapshot != nil:
		return src, "", "", nil
	case phase == bashtaskv1alpha1.WorkspacePending:
		return nil, "", fmt.Sprintf("waiting for spec.source.workspace %q to be Ready", name), nil
	default:
		return nil, fmt.Sprintf("spec.source.workspace %q is %s: it has no copy to fork", name, phase), "", nil
	}
}

// ownerName is owner as a message names it.
func ownerName(owner string) string {
	if owner == "" {
		return "no owner"
	}
	return fmt.Sprintf("owner %q", owner)
}

// forkGate checks the source of a fork not made yet before it is placed.
// done is true when the pass ends here: the fork refused (Failed,
// ForkRefused) or waiting for its source.
func (r *BashWorkspaceReconciler) forkGate(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) (*bashtaskv1alpha1.BashWorkspace, reconcile.Result, bool, error) {
	if !forkPending(ws) {
		return nil, reconcile.Result{}, false, nil
	}
	src, refusal, wait, err := r.forkSource(ctx, ws)
	switch {
	case err != nil:
		return nil, reconcile.Result{}, true, err
	case refusal != "":
		setWorkspaceFailed(ws, bashtaskv1alpha1.WorkspaceReasonForkRefused, refusal)
		p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonForkRefused, "Fork", "%s", refusal)
		return nil, reconcile.Result{}, true, reconcile.TerminalError(errors.New(refusal))
	case wait != "":
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, wait)
		return nil, reconcile.Result{RequeueAfter: r.opts.RetryInterval}, true, nil
	}
	return src, reconcile.Result{}, false, nil
}

// forkPlacement is the node a fork without a placement of its own goes
// to: its source's, so that the copy is local; "" otherwise.
func forkPlacement(ws, src *bashtaskv1alpha1.BashWorkspace) string {
	if src == nil || ws.Spec.NodeName != nil || len(ws.Spec.NodeSelector) > 0 {
		return ""
	}
	return ptr.Deref(src.Status.NodeName, "")
}

// forkSpec completes the agent's spec of the fork ws, to be made on node
// from src: the source named (fork_of), its image and size, and, unless
// src is Ready on node itself, the snapshot to restore: its last one
// when Suspended, else one taken now on its node (the source keeps
// running).
func (r *BashWorkspaceReconciler) forkSpec(ctx context.Context, ws, src *bashtaskv1alpha1.BashWorkspace, node string, spec *agentv1.WorkspaceSpec, secrets [][]byte) error {
	spec.ForkOf = workspaceRefOf(src)
	spec.Image = workspaceImageSpec(src, true, secrets)
	if ws.Spec.Storage == nil {
		spec.StorageBytes = ptr.Deref(src.Status.CapacityBytes, 0)
	}
	srcNode := ptr.Deref(src.Status.NodeName, "")
	switch {
	case workspacePhaseOf(&src.Status) == bashtaskv1alpha1.WorkspaceSuspended:
		spec.RestoreFrom = agentSnapshot(src.Status.Snapshot)
	case srcNode != node:
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		defer cancel()
		s, err := r.agents.SnapshotWorkspace(sctx, srcNode, string(src.UID))
		if err != nil {
			return fmt.Errorf("snapshot of the fork's source %s on node %s: %w", src.Name, srcNode, err)
		}
		spec.RestoreFrom = s
	}
	return nil
}

// forked records in ws's status what the agent's copy was forked from.
func (r *BashWorkspaceReconciler) forked(ws, src *bashtaskv1alpha1.BashWorkspace, f *agentv1.WorkspaceFork, from *agentv1.WorkspaceSnapshot, p *workspacePass) {
	t := metav1.NewTime(f.GetTime().AsTime().Truncate(time.Second))
	ws.Status.ForkedFrom = &bashtaskv1alpha1.WorkspaceForkStatus{
		Workspace: ptr.To(src.Name), UID: ptr.To(string(src.UID)), NodeName: src.Status.NodeName,
		Method: ptr.To(bashtaskv1alpha1.WorkspaceForkMethod(f.GetMethod())), Time: &t,
		FrozenMicroseconds: ptr.To(f.GetFrozenMicroseconds()),
	}
	if from != nil {
		ws.Status.ForkedFrom.SnapshotURL = optional(from.GetUrl())
	}
	p.event(corev1.EventTypeNormal, bashtaskv1alpha1.WorkspaceReasonForked, "Fork",
		"Forked from %s (%s, source frozen %d µs) on node %s, running as UID %d",
		src.Name, f.GetMethod(), f.GetFrozenMicroseconds(), ptr.Deref(ws.Status.NodeName, ""), ptr.Deref(ws.Status.RunAsUser, 0))
}
