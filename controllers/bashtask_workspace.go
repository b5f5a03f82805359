package controllers

import (
	"context"
	"fmt"
	"time"

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
	// image is the workspace's status.image, which the task's copies.
	image *bashtaskv1alpha1.ImageStatus
}

// checkWorkspace reads the task's workspace from the cache and decides
// with workspaceVerdict. An end is confirmed on a live read: a cache
// behind a resume (spec.suspend set back to false) or behind a workspace
// made again under the name must not end a task that the API server's
// view lets run. It costs one read, only for a task about to end.
func (r *BashTaskReconciler) checkWorkspace(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (workspaceCheck, error) {
	c, err := readWorkspaceCheck(ctx, r.client, bt)
	if err != nil || c.end == "" {
		return c, err
	}
	return readWorkspaceCheck(ctx, r.apiReader, bt)
}

// readWorkspaceCheck reads the task's workspace through reader and
// decides with workspaceVerdict.
func readWorkspaceCheck(ctx context.Context, reader client.Reader, bt *bashtaskv1alpha1.BashTask) (workspaceCheck, error) {
	name := ptr.Deref(bt.Spec.Workspace, "")
	ws := &bashtaskv1alpha1.BashWorkspace{}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: bt.Namespace, Name: name}, ws); err != nil {
		if !apierrors.IsNotFound(err) {
			return workspaceCheck{}, fmt.Errorf("reading workspace %s of %s: %w", name, klog.KObj(bt), err)
		}
		ws = nil
	}
	return workspaceVerdict(bt, ws), nil
}

// workspaceVerdict decides what ws (nil when it does not exist) means for
// a task not yet dispatched (docs/workspaces.md, "BashTask fields"): run
// there when it is Ready on a node and its owner matches; end the task
// InvalidSpec for another owner, Cancelled for a workspace being
// deleted, WorkspaceUnavailable for one that spec.suspend holds or that
// is NodeLost or Failed; else wait, with a message that says what for
// (workspaceWait): the workspace to be created (so that a GitOps apply of
// both works in any order), placed, made or restored, which a Suspended
// workspace that spec.suspend does not hold is for this task.
func workspaceVerdict(bt *bashtaskv1alpha1.BashTask, ws *bashtaskv1alpha1.BashWorkspace) workspaceCheck {
	name := ptr.Deref(bt.Spec.Workspace, "")
	if ws == nil {
		return workspaceCheck{wait: ReasonWorkspaceNotFound,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q not found in namespace %s; waiting for it to be created", name, bt.Namespace)}
	}
	if msg := ownerMismatch(bt, ws); msg != "" {
		return workspaceCheck{end: bashtaskv1alpha1.ReasonInvalidSpec, message: msg}
	}
	phase := workspacePhaseOf(&ws.Status)
	switch {
	case !ws.DeletionTimestamp.IsZero() || phase == bashtaskv1alpha1.WorkspaceTerminating:
		return workspaceCheck{end: bashtaskv1alpha1.ReasonCancelled,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q is being deleted; the task was not started", name)}
	case ptr.Deref(ws.Spec.Suspend, false):
		return workspaceCheck{end: bashtaskv1alpha1.ReasonWorkspaceUnavailable,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q is held by its spec.suspend (true), which keeps it off every node and its new tasks out; the task was not started. "+
				"Resume the workspace with `kubectl bashtask workspace resume %s` (or set its spec.suspend to false), then create the task again", name, name)}
	case phase == bashtaskv1alpha1.WorkspaceNodeLost || phase == bashtaskv1alpha1.WorkspaceFailed:
		return workspaceCheck{end: bashtaskv1alpha1.ReasonWorkspaceUnavailable,
			message: fmt.Sprintf("spec.workspace: BashWorkspace %q is %s (%s); it takes no more tasks, and the task was not started. Create a new workspace for new tasks",
				name, phase, ptr.Deref(ws.Status.Message, string(phase)))}
	case phase == bashtaskv1alpha1.WorkspaceReady && ptr.Deref(ws.Status.NodeName, "") != "":
		return workspaceCheck{target: &workspaceTarget{ref: workspaceRefOf(ws), node: *ws.Status.NodeName, image: ws.Status.Image.DeepCopy()}}
	}
	return workspaceCheck{wait: ReasonWorkspaceNotReady, message: workspaceWait(ws)}
}

// workspaceWait says what a task waits for in ws, which exists, takes
// tasks and is not Ready on a node yet: to be placed, made or restored
// (the workspace's own status message says which, and where), or, for a
// Suspended one, to be restored by this task.
func workspaceWait(ws *bashtaskv1alpha1.BashWorkspace) string {
	prefix := fmt.Sprintf("spec.workspace: BashWorkspace %q ", ws.Name)
	node, why := ptr.Deref(ws.Status.NodeName, ""), ptr.Deref(ws.Status.Message, "")
	switch phase := workspacePhaseOf(&ws.Status); phase {
	case "":
		return prefix + "is new and not placed on a node yet; the task starts once the controller has placed and made it"
	case bashtaskv1alpha1.WorkspaceSuspended:
		msg := prefix + fmt.Sprintf("is Suspended to its snapshot of %s, and this task restores it: the task starts once the workspace is placed on a node and restored there",
			snapshotTime(ws.Status.Snapshot).UTC().Format(time.RFC3339))
		if node != "" {
			msg += fmt.Sprintf(", after its copy on node %s is released", node)
		}
		return msg
	case bashtaskv1alpha1.WorkspacePending:
		if why == "" {
			why = "being placed on a node"
		}
		return prefix + "is Pending: " + why + "; the task starts once it is Ready"
	default:
		if why == "" {
			why = "no node"
		}
		return prefix + fmt.Sprintf("is %s (%s), not Ready on a node; the task starts once it is", phase, why)
	}
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
// workspace's node, as agents shows it, when it can take the task now,
// else nowhere, with ReasonNoAgent and why the task waits.
func workspaceAgent(agents agentLister, target *workspaceTarget) placement {
	a := agents.Agent(target.node)
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
