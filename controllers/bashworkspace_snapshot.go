package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Workspace snapshots (docs/workspaces.md, "Snapshots"): when the
// controller takes one (spec.snapshot.request, spec.snapshot's interval
// while tasks run, before a suspend), how a suspend releases the node's
// copy, and how a Suspended workspace, or one whose node was lost after a
// snapshot, comes back on a node at a new epoch.

// snapshotTimeout bounds one SnapshotWorkspace call: a workspace of its
// largest size at a bucket's slowest takes minutes, not hours.
const snapshotTimeout = 30 * time.Minute

// agentSnapshot is the agent's form of a snapshot in status; nil for none.
func agentSnapshot(s *bashtaskv1alpha1.WorkspaceSnapshotStatus) *agentv1.WorkspaceSnapshot {
	if s == nil {
		return nil
	}
	url := ptr.Deref(s.URL, "")
	return &agentv1.WorkspaceSnapshot{
		Url: url, Key: snapshotKey(url), Bytes: ptr.Deref(s.Bytes, 0), Sha256: ptr.Deref(s.SHA256, ""), Epoch: ptr.Deref(s.Epoch, 0),
	}
}

// restoreSource is the snapshot a new copy of ws is made from, nil for
// none. It refuses, with an error naming both, a status.snapshot outside
// ws's own prefix (agentv1.CheckSnapshotKey): whoever may write a
// workspace's status must not be able to fill it with another owner's
// files. The agent checks the same again.
func restoreSource(ws *bashtaskv1alpha1.BashWorkspace) (*agentv1.WorkspaceSnapshot, error) {
	from := agentSnapshot(ws.Status.Snapshot)
	if from == nil {
		return nil, nil
	}
	if err := agentv1.CheckSnapshotKey(workspaceRefOf(ws), from.GetKey()); err != nil {
		return nil, fmt.Errorf("status.snapshot.url %q: %w; nothing was restored", from.GetUrl(), err)
	}
	return from, nil
}

// snapshotKey is the bucket key in a snapshot's URL: what follows
// "/workspaces/", the prefix every snapshot key has (agent.SnapshotKey).
func snapshotKey(url string) string {
	for i := 0; i+len("/workspaces/") <= len(url); i++ {
		if url[i:i+len("/workspaces/")] == "/workspaces/" {
			return url[i+1:]
		}
	}
	return ""
}

// snapshotStatus is the status form of an agent's snapshot.
func snapshotStatus(s *agentv1.WorkspaceSnapshot, request *string) *bashtaskv1alpha1.WorkspaceSnapshotStatus {
	t := metav1.NewTime(s.GetTime().AsTime().Truncate(time.Second))
	return &bashtaskv1alpha1.WorkspaceSnapshotStatus{
		URL: ptr.To(s.GetUrl()), Bytes: ptr.To(s.GetBytes()), SHA256: ptr.To(s.GetSha256()), DataBytes: ptr.To(s.GetDataBytes()),
		Time: &t, Epoch: ptr.To(s.GetEpoch()), ChangedFiles: ptr.To(s.GetChanged()), Request: request,
	}
}

// snapshots takes the snapshots a Ready workspace is due: the one
// spec.snapshot.request asks for, one per spec.snapshot.intervalSeconds
// while a task runs, the suspend spec.suspend asks for, and one a while
// after its last task ended (afterTask). done is true when the pass ends
// here.
func (r *BashWorkspaceReconciler) snapshots(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) (reconcile.Result, bool, error) {
	if ptr.Deref(ws.Spec.Suspend, false) {
		res, err := r.suspend(ctx, ws, "spec.suspend is true", p)
		return res, true, err
	}
	if why := r.drained(ctx, ws); why != "" {
		res, err := r.suspend(ctx, ws, why, p)
		return res, true, err
	}
	pol := ptr.Deref(ws.Spec.Snapshot, bashtaskv1alpha1.WorkspaceSnapshotPolicy{})
	last := ws.Status.Snapshot
	if req := ptr.Deref(pol.Request, ""); req != "" && (last == nil || ptr.Deref(last.Request, "") != req) {
		return reconcile.Result{}, false, r.snapshot(ctx, ws, ptr.To(req), p)
	}
	if pol.IntervalSeconds != nil && ptr.Deref(ws.Status.RunningTasks, 0) > 0 {
		every := time.Duration(*pol.IntervalSeconds) * time.Second
		since := time.Duration(0)
		if last != nil {
			since = r.clock.Since(snapshotTime(last))
		}
		if last == nil || since >= every {
			return reconcile.Result{RequeueAfter: every}, true, r.snapshot(ctx, ws, lastRequest(last), p)
		}
		return reconcile.Result{RequeueAfter: min(every-since, r.opts.WorkspaceRefreshInterval)}, true, nil
	}
	res, err := r.afterTask(ctx, ws, p)
	return res, false, err
}

// lastRequest is the request the last snapshot answered, kept by a
// snapshot taken for another reason.
func lastRequest(last *bashtaskv1alpha1.WorkspaceSnapshotStatus) *string {
	if last == nil {
		return nil
	}
	return last.Request
}

// afterTaskDelay is how long after its last task ended a changed
// workspace is snapshotted: spec.snapshot.afterTaskSeconds, else the
// controller's WorkspaceSnapshotAfterTask; 0 or less is off.
func (r *BashWorkspaceReconciler) afterTaskDelay(ws *bashtaskv1alpha1.BashWorkspace) time.Duration {
	if ws.Spec.Snapshot != nil && ws.Spec.Snapshot.AfterTaskSeconds != nil {
		return time.Duration(*ws.Spec.Snapshot.AfterTaskSeconds) * time.Second
	}
	return r.opts.WorkspaceSnapshotAfterTask
}

// canSnapshot reports whether the agent holding ws writes snapshots to a
// bucket the nodes share (the snapshots capability).
func (r *BashWorkspaceReconciler) canSnapshot(ws *bashtaskv1alpha1.BashWorkspace) bool {
	return slices.Contains(r.agents.Agent(ptr.Deref(ws.Status.NodeName, "")).Capabilities, "snapshots")
}

// afterTask snapshots a workspace that changed since its last snapshot
// (a task ended after it) once afterTaskDelay passed since its last task
// ended, without suspending it, so that a lost node loses at most that
// much work after a task. It asks for the next pass when the snapshot is
// not due yet, and does nothing while a task runs (the interval is for
// that), for an unchanged workspace, or without a bucket.
func (r *BashWorkspaceReconciler) afterTask(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) (reconcile.Result, error) {
	delay := r.afterTaskDelay(ws)
	if delay <= 0 || !r.canSnapshot(ws) {
		return reconcile.Result{}, nil
	}
	changed, wait := snapshotDueAfterTask(&ws.Status, delay, r.clock.Now())
	switch {
	case !changed:
		return reconcile.Result{}, nil
	case wait > 0:
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	return reconcile.Result{}, r.snapshot(ctx, ws, lastRequest(ws.Status.Snapshot), p)
}

// snapshotDueAfterTask says whether the workspace of status st changed
// since its copy was last captured (its last task ended no earlier than
// its last snapshot began and than its copy was restored: both are
// whole seconds, so a task of the same second counts as a change, at
// the cost of one more snapshot) with no task running, and how long from
// now until it is due, delay after that task's end; 0 when due.
func snapshotDueAfterTask(st *bashtaskv1alpha1.BashWorkspaceStatus, delay time.Duration, now time.Time) (changed bool, wait time.Duration) {
	if st.LastTaskTime == nil || ptr.Deref(st.RunningTasks, 0) > 0 {
		return false, 0
	}
	covered := snapshotTime(st.Snapshot)
	if rf := st.RestoredFrom; rf != nil && rf.RestoreTime != nil && rf.RestoreTime.After(covered) {
		covered = rf.RestoreTime.Time
	}
	end := st.LastTaskTime.Time
	if end.Before(covered) {
		return false, 0
	}
	return true, max(end.Add(delay).Sub(now), 0)
}

// drained says why the workspace moves off its node, or "": its agent
// is draining (asked to stop: a DaemonSet rollout, a node shutdown), or
// its node no longer takes new work (cordoned by kubectl cordon or drain,
// not Ready, or tainted against the agent), its agent can snapshot, and
// its placement does not pin it to that node. Such a workspace is
// suspended once its running tasks end, and its next task restores it on
// a node that takes work.
func (r *BashWorkspaceReconciler) drained(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) string {
	node := ptr.Deref(ws.Status.NodeName, "")
	if node == "" || ptr.Deref(ws.Spec.NodeName, "") != "" {
		return ""
	}
	a := r.agents.Agent(node)
	if !slices.Contains(a.Capabilities, "snapshots") {
		return "" // no bucket to move through: it stays where its files are
	}
	if a.Connected && a.Draining {
		// The agent waits for this (within its
		// --shutdown-workspace-timeout) before it stops.
		return fmt.Sprintf("the agent on node %s is shutting down: moving to another node", node)
	}
	var n corev1.Node
	if err := r.client.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return ""
	}
	why := nodeUnschedulable(&n, r.opts.AgentTolerations)
	if why == "" {
		return ""
	}
	return why + ": moving to another node"
}

// snapshot has the workspace's agent take a snapshot and records it. A
// failed snapshot keeps the earlier one, with a warning event, and is
// retried; an error is returned only for a retry.
func (r *BashWorkspaceReconciler) snapshot(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, request *string, p *workspacePass) error {
	node := ptr.Deref(ws.Status.NodeName, "")
	sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	s, err := r.agents.SnapshotWorkspace(sctx, node, string(ws.UID))
	if err != nil {
		st, _ := status.FromError(err)
		p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonSnapshotFailed, "Snapshot",
			"The snapshot on node %s failed: %s; the last snapshot stays the workspace's", node, st.Message())
		return fmt.Errorf("snapshot of workspace %s: %w", klog.KObj(ws), err)
	}
	ws.Status.Snapshot = snapshotStatus(s, request)
	p.event(corev1.EventTypeNormal, bashtaskv1alpha1.WorkspaceReasonSnapshotted, "Snapshot",
		"Snapshot of %d bytes (%d files, %d changed while read, %d tasks running) at %s", s.GetBytes(), s.GetFiles(), s.GetChanged(), s.GetRunningTasks(), s.GetUrl())
	return nil
}

// suspend snapshots the workspace once it runs no task and then releases
// its node's copy: the phase is Suspended, written before the copy is
// deleted (with the node still named), so that no task is dispatched to
// a copy about to go and a controller that stops in between finishes the
// release.
func (r *BashWorkspaceReconciler) suspend(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, why string, p *workspacePass) (reconcile.Result, error) {
	if n := ptr.Deref(ws.Status.RunningTasks, 0); n > 0 {
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceReady, fmt.Sprintf("%s: suspending once its %d running tasks end", why, n))
		return reconcile.Result{RequeueAfter: r.opts.WorkspaceRefreshInterval}, nil
	}
	last := ws.Status.Snapshot
	fresh := last != nil && ptr.Deref(last.Epoch, 0) == ptr.Deref(ws.Status.Epoch, 0) &&
		(ws.Status.LastTaskTime == nil || snapshotTime(last).After(ws.Status.LastTaskTime.Time))
	if !fresh {
		if err := r.snapshot(ctx, ws, lastRequest(last), p); err != nil {
			return reconcile.Result{}, err
		}
	}
	node := ptr.Deref(ws.Status.NodeName, "")
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceSuspended, fmt.Sprintf("%s: suspended to its snapshot of %s; releasing its copy on node %s",
		why, snapshotTime(ws.Status.Snapshot).UTC().Format(time.RFC3339), node))
	// The status write of this pass wakes the next, which releases the copy.
	return reconcile.Result{RequeueAfter: time.Millisecond}, nil
}

// reconcileSuspended finishes a suspend (the node's copy deleted, the
// node's fields cleared) and restores the workspace when a task of it
// waits, or when its spec changed since it was suspended (spec.suspend
// set back to false), unless spec.suspend is true.
func (r *BashWorkspaceReconciler) reconcileSuspended(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, old *bashtaskv1alpha1.BashWorkspaceStatus, p *workspacePass) (reconcile.Result, error) {
	if node := ptr.Deref(ws.Status.NodeName, ""); node != "" {
		if a := r.agents.Agent(node); a.Connected {
			// A task's reconciler that read the workspace Ready from its
			// cache just before the suspend was written may have started a
			// task on the copy since: keep the copy and its task rather
			// than cancel it, and suspend again once it ends.
			if st, err := r.agents.GetWorkspace(ctx, node, string(ws.UID)); err == nil && st.GetRunningTasks() > 0 {
				n := st.GetRunningTasks()
				ws.Status.RunningTasks = ptr.To(n)
				setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceReady, fmt.Sprintf("the suspend was given up: %d tasks started on node %s meanwhile; it is suspended again once they end", n, node))
				return reconcile.Result{RequeueAfter: r.opts.WorkspaceRefreshInterval}, nil
			}
			if _, err := r.agents.DeleteWorkspace(ctx, node, string(ws.UID)); err != nil {
				return reconcile.Result{}, fmt.Errorf("releasing the copy of suspended workspace %s: %w", klog.KObj(ws), err)
			}
		} else if r.nodeLost(ctx, node) == "" {
			// Its agent is away: the copy goes when it is back (or with it).
			return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil
		}
		s := &ws.Status
		p.event(corev1.EventTypeNormal, bashtaskv1alpha1.WorkspaceReasonSuspended, "Suspend", "Suspended; its copy on node %s released (UID %d)", node, ptr.Deref(s.RunAsUser, 0))
		s.NodeName, s.RunAsUser, s.UsedBytes, s.CapacityBytes, s.RunningTasks = nil, nil, nil, nil, nil
		// The message keeps why it was suspended (suspend wrote it).
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceSuspended, strings.TrimSuffix(ptr.Deref(ws.Status.Message, ""), "; releasing its copy on node "+node))
		suspendedNote(ws)
		return reconcile.Result{}, nil
	}
	if ptr.Deref(ws.Spec.Suspend, false) {
		suspendedNote(ws)
		return reconcile.Result{}, nil
	}
	wanted := ptr.Deref(ws.Status.ObservedGeneration, 0) != ws.Generation
	if !wanted {
		var err error
		if wanted, err = r.hasUnfinishedTasks(ctx, r.client, ws); err != nil {
			return reconcile.Result{}, err
		}
	}
	if !wanted {
		return reconcile.Result{}, nil
	}
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, "to be restored from its snapshot")
	return r.reconcilePending(ctx, ws, old, p)
}

// The ends of a Suspended workspace's message: what restores it.
const (
	restoredByNextTask = "; its next task restores it on a node"
	heldBySuspend      = "; spec.suspend holds it: a task naming it is refused until it is resumed (kubectl bashtask workspace resume, or spec.suspend set to false)"
)

// suspendedNote ends a Suspended workspace's message with what restores
// it: its next task, or, while spec.suspend holds it, a resume (its
// tasks are refused meanwhile, docs/workspaces.md).
func suspendedNote(ws *bashtaskv1alpha1.BashWorkspace) {
	msg := strings.TrimSuffix(strings.TrimSuffix(ptr.Deref(ws.Status.Message, ""), restoredByNextTask), heldBySuspend)
	note := restoredByNextTask
	if ptr.Deref(ws.Spec.Suspend, false) {
		note = heldBySuspend
	}
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceSuspended, msg+note)
}

// suspendLost takes a lost node's workspace that has a snapshot to
// Suspended instead of NodeLost: its next task restores it elsewhere from
// that snapshot, and the event says what may be lost. It reports whether
// it did.
func (r *BashWorkspaceReconciler) suspendLost(ws *bashtaskv1alpha1.BashWorkspace, msg string, p *workspacePass) bool {
	snap := ws.Status.Snapshot
	if snap == nil {
		return false
	}
	s := &ws.Status
	node := ptr.Deref(s.NodeName, "")
	lost := metav1.NewTime(r.clock.Now().Truncate(time.Second))
	s.NodeLoss = &bashtaskv1alpha1.WorkspaceNodeLoss{NodeName: optional(node), Time: &lost}
	s.NodeName, s.RunAsUser, s.UsedBytes, s.CapacityBytes, s.RunningTasks = nil, nil, nil, nil, nil
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceSuspended, fmt.Sprintf("%s; its next task restores it on another node from its snapshot of %s",
		msg, snapshotTime(snap).UTC().Format(time.RFC3339)))
	p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonNodeLost, "Follow",
		"Node %s lost (%s). The workspace will be restored from its snapshot of %s (%s old): whatever its tasks wrote after that is lost",
		node, msg, snapshotTime(snap).UTC().Format(time.RFC3339), r.clock.Since(snapshotTime(snap)).Round(time.Second))
	return true
}

// restored records that the workspace's new copy on node came from its
// snapshot, how old the snapshot was, and the node loss that made the
// restore necessary (status.nodeLoss, moved here). The first task
// dispatched to the copy claims the notice (firstTask, unset here).
func (r *BashWorkspaceReconciler) restored(ws *bashtaskv1alpha1.BashWorkspace, node string, p *workspacePass) {
	snap := ws.Status.Snapshot
	now := r.clock.Now()
	restored := metav1.NewTime(now.Truncate(time.Second))
	taken := metav1.NewTime(snapshotTime(snap))
	ws.Status.RestoredFrom = &bashtaskv1alpha1.WorkspaceRestoreStatus{
		URL: snap.URL, SnapshotTime: &taken, RestoreTime: &restored,
		AgeSeconds: ptr.To(max(int64(now.Sub(taken.Time)/time.Second), 0)),
	}
	if loss := ws.Status.NodeLoss; loss != nil {
		ws.Status.RestoredFrom.LostNode, ws.Status.RestoredFrom.LostTime = loss.NodeName, loss.Time
		ws.Status.NodeLoss = nil
	}
	p.event(corev1.EventTypeNormal, bashtaskv1alpha1.WorkspaceReasonRestored, "Restore",
		"Restored on node %s at epoch %d from its snapshot of %s (%ds old), running as UID %d",
		node, ptr.Deref(ws.Status.Epoch, 0), snapshotTime(snap).UTC().Format(time.RFC3339), *ws.Status.RestoredFrom.AgeSeconds, ptr.Deref(ws.Status.RunAsUser, 0))
}

// snapshotTime is when the snapshot began; the zero time when unknown.
func snapshotTime(s *bashtaskv1alpha1.WorkspaceSnapshotStatus) time.Time {
	if s == nil || s.Time == nil {
		return time.Time{}
	}
	return s.Time.Time
}
