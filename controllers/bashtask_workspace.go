package controllers

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// workspaceCheck is what a task's spec.workspace means for its dispatch
// now: a target to run in, a wait (reason and message, Scheduled=False) or
// an end (a terminal reason and message).
type workspaceCheck struct {
	// target is the Ready workspace to dispatch to.
	target *workspaceTarget
	// wait is the Scheduled reason of a task that waits for its workspace.
	wait string
	// end is the terminal reason of a task that cannot run in it.
	end bashtaskv1alpha1.Reason
	// message explains the wait or the end.
	message string
}

// workspaceTarget is where a task of a workspace runs.
type workspaceTarget struct {
	ref  *agentv1.WorkspaceRef
	node string
}

// checkWorkspace reads the task's workspace from the cache and decides:
// run there when it is Ready and its owner matches; wait while it does not
// exist or is not Ready yet (so a GitOps apply of both works in any
// order); end the task InvalidSpec for another owner or a workspace that
// is NodeLost or Failed, and Cancelled for one being deleted.
func (r *BashTaskReconciler) checkWorkspace(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (workspaceCheck, error) {
	name := ptr.Deref(bt.Spec.Workspace, "")
	ws := &bashtaskv1alpha1.BashWorkspace{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: bt.Namespace, Name: name}, ws); err != nil {
		if apierrors.IsNotFound(err) {
			return workspaceCheck{wait: ReasonWorkspaceNotFound,
				message: fmt.Sprintf("spec.workspace: BashWorkspace %q not found in namespace %s; waiting for it to be created", name, bt.Namespace)}, nil
		}
		return workspaceCheck{}, fmt.Errorf("reading workspace %s of %s: %w", name, klog.KObj(bt), err)
	}
	if msg := ownerMismatch(bt, ws); msg != "" {
		return workspaceCheck{end: bashtaskv1alpha1.ReasonInvalidSpec, message: msg}, nil
	}
	phase := workspacePhaseOf(&ws.Status)
	why := ptr.Deref(ws.Status.Message, string(phase))
	switch {
	case !ws.DeletionTimestamp.IsZero() || phase == bashtaskv1alpha1.WorkspaceTerminating:
		return workspaceCheck{end: bashtaskv1alpha1.ReasonCancelled,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q is being deleted; the task was not started", name)}, nil
	case phase == bashtaskv1alpha1.WorkspaceNodeLost || phase == bashtaskv1alpha1.WorkspaceFailed:
		return workspaceCheck{end: bashtaskv1alpha1.ReasonInvalidSpec,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q is %s (%s); it takes no more tasks", name, phase, why)}, nil
	case phase != bashtaskv1alpha1.WorkspaceReady || ptr.Deref(ws.Status.NodeName, "") == "" || ptr.Deref(ws.Spec.Suspend, false):
		switch phase {
		case "":
			why = "not placed yet"
		case bashtaskv1alpha1.WorkspaceReady:
			why = "spec.suspend is true: it is being suspended"
		}
		return workspaceCheck{wait: ReasonWorkspaceNotReady,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q is not Ready (%s); waiting for it", name, why)}, nil
	}
	return workspaceCheck{target: &workspaceTarget{
		ref:  workspaceRefOf(ws),
		node: *ws.Status.NodeName,
	}}, nil
}

// ownerMismatch names both owners when the workspace has an owner and the
// task another one, or none; "" when the task may run there.
func ownerMismatch(bt *bashtaskv1alpha1.BashTask, ws *bashtaskv1alpha1.BashWorkspace) string {
	want := ws.Spec.Owner
	if want == nil || ptr.Equal(bt.Spec.Owner, want) {
		return ""
	}
	if bt.Spec.Owner == nil {
		return fmt.Sprintf("spec.owner is unset, and BashWorkspace %q belongs to owner %q: only that owner's tasks run in it", ws.Name, *want)
	}
	return fmt.Sprintf("spec.owner %q differs from the owner %q of BashWorkspace %q: only that owner's tasks run in it", *bt.Spec.Owner, *want, ws.Name)
}

// workspaceAgent places a task of a workspace: on the agent of the
// workspace's node when it can take the task now, else nowhere, with
// ReasonNoAgent and why the task waits.
func (r *BashTaskReconciler) workspaceAgent(target *workspaceTarget) placement {
	a := r.agents.Agent(target.node)
	switch {
	case !a.Ready:
		return placement{reason: ReasonNoAgent, why: fmt.Sprintf("the agent on node %s, which holds BashWorkspace %q, is not ready; retrying", target.node, target.ref.GetName())}
	case a.Capacity > 0 && a.Running >= a.Capacity:
		return placement{reason: ReasonNoAgent, why: fmt.Sprintf("the agent on node %s, which holds BashWorkspace %q, runs its maximum of %d tasks; retrying", target.node, target.ref.GetName(), a.Capacity)}
	}
	return placement{agent: &a}
}

// workspaceRef reads the reference a dispatched task's Start carries,
// when the pass that wrote the dispatch is not the one that starts it (a
// controller restarted in between). It returns a non-empty end when the
// workspace is gone: the task then ends Cancelled, as its running tasks
// do when a workspace is deleted. A workspace made again under the name
// has another UID, which its agent does not hold: the agent ends the
// task StartFailed naming it.
func (r *BashTaskReconciler) workspaceRef(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (*agentv1.WorkspaceRef, string, error) {
	name := ptr.Deref(bt.Spec.Workspace, "")
	if name == "" {
		return nil, "", nil
	}
	ws := &bashtaskv1alpha1.BashWorkspace{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: bt.Namespace, Name: name}, ws); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("spec.workspace: BashWorkspace %q was deleted before the task started", name), nil
		}
		return nil, "", fmt.Errorf("reading workspace %s of %s: %w", name, klog.KObj(bt), err)
	}
	return workspaceRefOf(ws), "", nil
}

// workspaceRefOf is the agent's reference to ws's current copy: its UID
// and epoch, so that an agent holding a copy of another epoch refuses
// the task.
func workspaceRefOf(ws *bashtaskv1alpha1.BashWorkspace) *agentv1.WorkspaceRef {
	return &agentv1.WorkspaceRef{Namespace: ws.Namespace, Name: ws.Name, Uid: string(ws.UID), Epoch: ptr.Deref(ws.Status.Epoch, 0)}
}

// tasksWaitingForWorkspace maps a workspace to the tasks that name it and
// have not been dispatched: its creation or its becoming Ready is what
// they wait for.
func (r *BashTaskReconciler) tasksWaitingForWorkspace(ctx context.Context, o client.Object) []reconcile.Request {
	var list bashtaskv1alpha1.BashTaskList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{IndexWorkspace: o.GetName()}); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if t := &list.Items[i]; !isDispatched(t) && !isTerminal(t) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(t)})
		}
	}
	return reqs
}
