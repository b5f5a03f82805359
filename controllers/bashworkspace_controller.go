package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// +kubebuilder:rbac:groups=bashtask.dev,resources=bashworkspaces,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=bashtask.dev,resources=bashworkspaces/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=bashtask.dev,resources=bashworkspaces/finalizers,verbs=update

// WorkspaceAgents is what the BashWorkspace reconciler needs from the node
// agents. AgentRegistry implements it over mTLS gRPC.
type WorkspaceAgents interface {
	// Agents returns the state of every known agent.
	Agents() []agentpool.AgentState
	// Agent returns the state of one node's agent.
	Agent(node string) agentpool.AgentState
	// EnsureWorkspace makes a workspace or returns it as it is;
	// idempotent on the workspace UID.
	EnsureWorkspace(ctx context.Context, node string, spec *agentv1.WorkspaceSpec) (*agentv1.EnsureWorkspaceResponse, error)
	// GetWorkspace returns a workspace's state or an error wrapping
	// ErrWorkspaceUnknown.
	GetWorkspace(ctx context.Context, node, uid string) (*agentv1.WorkspaceStatus, error)
	// DeleteWorkspace stops a workspace's tasks and removes it;
	// idempotent.
	DeleteWorkspace(ctx context.Context, node, uid string) (int32, error)
	// SnapshotWorkspace archives a workspace to the agents' bucket.
	SnapshotWorkspace(ctx context.Context, node, uid string) (*agentv1.WorkspaceSnapshot, error)
}

// BashWorkspaceReconciler reconciles BashWorkspaces through the node
// agents: it places each workspace, records the node before it asks the
// agent to make it (write-ahead, as for tasks), follows its state on the
// agent into status, reports a lost node, deletes an idle workspace, and
// on deletion has the agent stop its tasks and remove it.
type BashWorkspaceReconciler struct {
	client    client.Client
	apiReader client.Reader
	agents    WorkspaceAgents
	recorder  events.EventRecorder
	clock     clock.PassiveClock
	opts      Options

	keptMu sync.Mutex
	kept   map[types.NamespacedName]types.UID // managed workspaces kept past their idle timeout, with the event sent

	refusedMu sync.Mutex
	refused   map[types.UID]map[string]int64 // egress refusals reported as events: name -> agent's count

	injected sync.Map // types.UID -> the digest of the injection values the agent last got (egressGate)

	// byNode is the workspace informer's store, indexed by node
	// (workspaceNodeIndex), for placement's counts; nil until
	// SetupWithManager finds it, when the counts list the cache instead.
	byNode toolscache.Indexer
}

// NewBashWorkspaceReconciler returns a reconciler. c is the manager's
// cached client, apiReader reads uncached (mgr.GetAPIReader). Of opts it
// uses AgentLostAfter, AgentTolerations, RetryInterval,
// WorkspaceRefreshInterval, WorkspaceIdleRefreshInterval and Fence.
func NewBashWorkspaceReconciler(c client.Client, apiReader client.Reader, agents WorkspaceAgents, recorder events.EventRecorder, clk clock.PassiveClock, opts Options) *BashWorkspaceReconciler {
	return &BashWorkspaceReconciler{
		client: c, apiReader: apiReader, agents: agents, recorder: recorder, clock: clk, opts: opts,
		kept: map[types.NamespacedName]types.UID{}, refused: map[types.UID]map[string]int64{},
	}
}

// SetupWithManager registers the reconciler, its cache index and its event
// sources: BashWorkspace changes, the start and end of the workspace's
// tasks (their phase), Node deletions and scheduling changes, and, from
// agentChanges when it is not nil (AgentRegistryOptions.AgentChanged),
// the nodes whose agent's readiness changed, such as an agent that began
// to drain.
func (r *BashWorkspaceReconciler) SetupWithManager(mgr ctrl.Manager, agentChanges <-chan event.TypedGenericEvent[*corev1.Node], workers int) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &bashtaskv1alpha1.BashWorkspace{}, IndexWorkspaceNode,
		func(o client.Object) []string {
			if n := ptr.Deref(o.(*bashtaskv1alpha1.BashWorkspace).Status.NodeName, ""); n != "" {
				return []string{n}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("indexing BashWorkspaces by %s: %w", IndexWorkspaceNode, err)
	}
	if err := r.indexByNode(mgr.GetCache()); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&bashtaskv1alpha1.BashWorkspace{}).
		Named("bashworkspace").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Watches(&bashtaskv1alpha1.BashTask{}, handler.EnqueueRequestsFromMapFunc(workspaceOfTask),
			builder.WithPredicates(taskPhaseChanged())).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.workspacesOnNode),
			builder.WithPredicates(predicate.Or(nodeSchedulingChanged(), predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return true },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})))
	if agentChanges != nil {
		b = b.WatchesRawSource(source.Channel(agentChanges, handler.TypedEnqueueRequestsFromMapFunc(
			func(ctx context.Context, n *corev1.Node) []reconcile.Request { return r.workspacesOnNode(ctx, n) })))
	}
	return b.Complete(r)
}

// workspaceOfTask maps a task to the workspace it names.
func workspaceOfTask(_ context.Context, o client.Object) []reconcile.Request {
	bt, ok := o.(*bashtaskv1alpha1.BashTask)
	if !ok || ptr.Deref(bt.Spec.Workspace, "") == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: bt.Namespace, Name: *bt.Spec.Workspace}}}
}

// taskPhaseChanged passes a task's creation, deletion and phase changes:
// what changes a workspace's running tasks and last task time. Progress
// writes of a running task pass nothing, so they cost the workspace no
// agent call.
func taskPhaseChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*bashtaskv1alpha1.BashTask)
			n, ok2 := e.ObjectNew.(*bashtaskv1alpha1.BashTask)
			return ok1 && ok2 && (phaseOf(&o.Status) != phaseOf(&n.Status) || reasonOf(&o.Status) != reasonOf(&n.Status))
		},
	}
}

// workspacesOnNode maps a Node to the workspaces it holds.
func (r *BashWorkspaceReconciler) workspacesOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	var list bashtaskv1alpha1.BashWorkspaceList
	if err := r.client.List(ctx, &list, client.MatchingFields{IndexWorkspaceNode: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// workspacePass collects what one pass does besides the status: the events
// it owes, sent only after the status write succeeded, and whether the
// workspace is due for deletion by its idle timeout.
type workspacePass struct {
	events     []workspaceEvent
	deleteIdle bool
	// onSent record what the events told, once they are sent: a pass
	// whose status write fails sends no event, and the next pass must
	// find them still untold.
	onSent []func()
}

type workspaceEvent struct {
	typ, reason, action, note string
}

func (p *workspacePass) event(typ, reason, action, format string, args ...any) {
	p.events = append(p.events, workspaceEvent{typ: typ, reason: reason, action: action, note: truncateMessage(fmt.Sprintf(format, args...))})
}

// afterSend runs f once the pass's events are sent.
func (p *workspacePass) afterSend(f func()) { p.onSent = append(p.onSent, f) }

// sent runs what afterSend registered.
func (p *workspacePass) sent() {
	for _, f := range p.onSent {
		f()
	}
}

// Reconcile moves one workspace one step through its life.
func (r *BashWorkspaceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ws := &bashtaskv1alpha1.BashWorkspace{}
	if err := r.client.Get(ctx, req.NamespacedName, ws); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetKept(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	res, err := r.reconcile(ctx, ws)
	if apierrors.IsConflict(err) {
		// The cache was behind the object: nothing computed from it was
		// stored. The newer version's watch event brings the next pass.
		ctrl.LoggerFrom(ctx).V(1).Info("Stale workspace; waiting for the newer version", "err", err)
		return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil
	}
	return res, err
}

// reconcile runs the phase function of ws, writes the status once if it
// changed, then sends the pass's events and deletes an idle workspace.
func (r *BashWorkspaceReconciler) reconcile(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) (reconcile.Result, error) {
	if !ws.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, ws)
	}
	old := ws.Status.DeepCopy()
	p := &workspacePass{}
	var res reconcile.Result
	var err error
	switch workspacePhaseOf(&ws.Status) {
	case bashtaskv1alpha1.WorkspaceReady:
		res, err = r.reconcileReady(ctx, ws, p)
	case bashtaskv1alpha1.WorkspaceSuspended:
		res, err = r.reconcileSuspended(ctx, ws, old, p)
	case bashtaskv1alpha1.WorkspaceNodeLost, bashtaskv1alpha1.WorkspaceFailed:
		// Final until deleted: a workspace with a snapshot is Suspended
		// instead (suspendLost), so these have nothing to move from.
		// Only observedGeneration follows spec edits.
	default:
		res, err = r.reconcilePending(ctx, ws, old, p)
	}
	if werr := r.writeStatus(ctx, ws, old); werr != nil {
		return reconcile.Result{}, errors.Join(werr, err)
	}
	for _, e := range p.events {
		r.recorder.Eventf(ws, nil, e.typ, e.reason, e.action, "%s", e.note)
	}
	p.sent()
	if p.deleteIdle {
		return reconcile.Result{}, r.deleteIdle(ctx, ws)
	}
	return res, err
}

// reconcilePending places the workspace, records the node (write-ahead)
// and has the agent make it. old is updated when the write-ahead is
// written.
func (r *BashWorkspaceReconciler) reconcilePending(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, old *bashtaskv1alpha1.BashWorkspaceStatus, p *workspacePass) (reconcile.Result, error) {
	secrets, res, done, err := r.imageGate(ctx, ws, p)
	if done {
		return res, err
	}
	src, res, done, err := r.forkGate(ctx, ws, p)
	if done {
		return res, err
	}
	inject, res, done, err := r.egressGate(ctx, ws, p)
	if done {
		return res, err
	}
	node := ptr.Deref(ws.Status.NodeName, "")
	if node == "" {
		if err := r.addFinalizer(ctx, ws); err != nil {
			return reconcile.Result{}, err
		}
		pl := placeAgent(ctx, r.client, r.agents, placementRequest{
			what:         "the workspace",
			nodeName:     cmp.Or(ptr.Deref(ws.Spec.NodeName, ""), forkPlacement(ws, src)),
			nodeSelector: ws.Spec.NodeSelector,
			network:      ptr.Deref(ws.Spec.Network, ""),
			tolerations:  r.opts.AgentTolerations,
			workspace:    true,
			restore:      ws.Status.Snapshot != nil,
			image:        ws.Spec.Image != nil || ws.Status.Image != nil,
			rootInside:   ptr.Deref(ws.Spec.RootInside, false),
			anyCapacity:  true,
			load:         r.workspaceLoad(ctx),
		})
		if pl.invalid != "" {
			setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceFailed, pl.invalid)
			p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonInvalidSpec, "Place", "%s", pl.invalid)
			return reconcile.Result{}, reconcile.TerminalError(errors.New(pl.invalid))
		}
		agent := pl.agent
		if agent == nil {
			setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, pl.why)
			return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil
		}
		// Write ahead: the node is recorded before the agent is asked, in
		// a write conditional on the resourceVersion read. A stale cache or
		// a second controller loses here with a conflict instead of making
		// the workspace on a second node, and a controller that stops
		// after EnsureWorkspace finds the node it used.
		node = agent.Node
		ws.Status.NodeName = ptr.To(node)
		// Each placement is a new epoch, recorded with the node before
		// the agent is asked: the copy it makes is the only current one.
		ws.Status.Epoch = ptr.To(ptr.Deref(ws.Status.Epoch, 0) + 1)
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, "being made on node "+node)
		if ws.Status.Snapshot != nil {
			setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, fmt.Sprintf("being restored on node %s from its snapshot of %s", node, snapshotTime(ws.Status.Snapshot).UTC().Format(time.RFC3339)))
		}
		if err := r.writeStatus(ctx, ws, old); err != nil {
			return reconcile.Result{}, err
		}
		*old = *ws.Status.DeepCopy()
	}
	if lost := r.nodeLost(ctx, node); lost != "" {
		r.setNodeLost(ws, lost, p)
		return reconcile.Result{}, nil
	}
	if agent := r.agents.Agent(node); !agent.Connected {
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, fmt.Sprintf("waiting for the agent on node %s, unreachable for %s", node, agent.UnreachableFor.Round(time.Second)))
		return reconcile.Result{RequeueAfter: max(r.opts.AgentLostAfter-agent.UnreachableFor, r.opts.RetryInterval)}, nil
	}
	spec := workspaceSpec(ws)
	withInjections(spec, inject)
	from, err := restoreSource(ws)
	if err != nil {
		setWorkspaceFailed(ws, bashtaskv1alpha1.WorkspaceReasonSnapshotRefused, err.Error())
		p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonSnapshotRefused, "Restore", "%v", err)
		return reconcile.Result{}, reconcile.TerminalError(err)
	}
	spec.RestoreFrom = from
	// A workspace restored from its snapshot was made before.
	spec.Image = workspaceImageSpec(ws, ws.Status.Snapshot != nil, secrets)
	if src != nil {
		if err := r.forkSpec(ctx, ws, src, node, spec, secrets); err != nil {
			setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, err.Error()+"; retrying")
			return reconcile.Result{}, err
		}
	}
	resp, err := r.agents.EnsureWorkspace(ctx, node, spec)
	if err != nil {
		return r.ensureFailed(ws, node, err, p)
	}
	r.injected.Store(ws.UID, injectionDigest(inject))
	if res, done, err := r.imageAnswer(ws, node, resp, p); done {
		return res, err
	}
	applyWorkspaceStatus(ws, resp.GetStatus(), node)
	setEgressCondition(ws)
	r.noteNoSnapshots(ws)
	if f := resp.GetStatus().GetForkedFrom(); f != nil && src != nil {
		r.forked(ws, src, f, spec.GetRestoreFrom(), p)
	} else if from := resp.GetStatus().GetRestoredFrom(); from != nil && ws.Status.Snapshot != nil {
		r.restored(ws, node, p)
	} else {
		p.event(corev1.EventTypeNormal, bashtaskv1alpha1.WorkspaceReasonReady, "Make", "Ready on node %s, running as UID %d", node, ptr.Deref(ws.Status.RunAsUser, 0))
	}
	return r.idle(ctx, ws, p)
}

// ensureFailed records why the agent did not make the workspace: a
// refusal of the spec is final (Failed, InvalidSpec), a full or older
// agent a wait, anything else an error to retry.
func (r *BashWorkspaceReconciler) ensureFailed(ws *bashtaskv1alpha1.BashWorkspace, node string, err error, p *workspacePass) (reconcile.Result, error) {
	st, _ := status.FromError(err)
	switch code := status.Code(err); {
	case (code == codes.InvalidArgument || code == codes.FailedPrecondition) && !agentpool.FencedRefusal(err):
		msg := fmt.Sprintf("the agent on node %s refused the workspace: %s", node, st.Message())
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceFailed, msg)
		p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonInvalidSpec, "Make", "%s", msg)
		return reconcile.Result{}, reconcile.TerminalError(err)
	case code == codes.ResourceExhausted:
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, fmt.Sprintf("the agent on node %s has no room for another workspace: %s; retrying", node, st.Message()))
		return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil
	case code == codes.Unimplemented:
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, fmt.Sprintf("the agent on node %s does not serve workspaces (an older version); retrying", node))
		return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil
	}
	return reconcile.Result{}, fmt.Errorf("making workspace %s: %w", klog.KObj(ws), err)
}

// reconcileReady follows a made workspace: its state on the agent, a lost
// node, a carry-over edited in the spec, and the idle timeout.
func (r *BashWorkspaceReconciler) reconcileReady(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) (reconcile.Result, error) {
	node := ptr.Deref(ws.Status.NodeName, "")
	if lost := r.nodeLost(ctx, node); lost != "" {
		r.setNodeLost(ws, lost, p)
		return reconcile.Result{}, nil
	}
	agent := r.agents.Agent(node)
	if !agent.Connected {
		// The status stays as last seen until the agent is back or lost.
		return reconcile.Result{RequeueAfter: min(max(r.opts.AgentLostAfter-agent.UnreachableFor, r.opts.RetryInterval), r.opts.WorkspaceRefreshInterval)}, nil
	}
	uid := string(ws.UID)
	var st *agentv1.WorkspaceStatus
	inject, missing, err := r.egressInjections(ctx, ws)
	if err != nil {
		return reconcile.Result{}, err
	}
	if missing == nil && (ptr.Deref(ws.Status.ObservedGeneration, 0) != ws.Generation || r.injectionsChanged(ws.UID, inject)) {
		// spec.carryOver or spec.egress changed, or a Secret of
		// spec.egress.inject: the agent applies it from the next task
		// (the policy at once).
		var resp *agentv1.EnsureWorkspaceResponse
		spec := workspaceSpec(ws)
		withInjections(spec, inject)
		spec.Image = workspaceImageSpec(ws, true, nil)
		if resp, err = r.agents.EnsureWorkspace(ctx, node, spec); err == nil {
			st = resp.GetStatus()
			r.injected.Store(ws.UID, injectionDigest(inject))
		}
		if err == nil && st == nil {
			// An answer without the workspace's state (a pull, which a
			// made workspace never needs): read it instead.
			st, err = r.agents.GetWorkspace(ctx, node, uid)
		}
	} else {
		st, err = r.agents.GetWorkspace(ctx, node, uid)
	}
	switch {
	case errors.Is(err, agentpool.ErrWorkspaceUnknown):
		r.setNodeLost(ws, fmt.Sprintf("the agent on node %s (incarnation %s) no longer holds the workspace: its files are gone", node, agent.Incarnation), p)
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("reading workspace %s: %w", klog.KObj(ws), err)
	}
	applyWorkspaceStatus(ws, st, node)
	setEgressCondition(ws)
	if missing != nil {
		setEgressMissing(ws, missing)
	}
	r.egressRefusalEvents(ws, st, p)
	r.noteNoSnapshots(ws)
	res, done, err := r.snapshots(ctx, ws, p)
	if done || err != nil {
		return res, err
	}
	next, err := r.idle(ctx, ws, p)
	if missing != nil {
		next = soonest(next, reconcile.Result{RequeueAfter: r.opts.RetryInterval})
	}
	return soonest(res, next), err
}

// soonest is the result of the two whose requeue comes first; a result
// without a requeue gives way to one with.
func soonest(a, b reconcile.Result) reconcile.Result {
	switch {
	case a.RequeueAfter <= 0:
		return b
	case b.RequeueAfter <= 0 || a.RequeueAfter < b.RequeueAfter:
		return a
	}
	return b
}

// noteNoSnapshots adds to a Ready workspace's message that its agent
// cannot snapshot it (no bucket the nodes share): nothing bounds what a
// loss of its node loses, and the status says so rather than nothing.
func (r *BashWorkspaceReconciler) noteNoSnapshots(ws *bashtaskv1alpha1.BashWorkspace) {
	if workspacePhaseOf(&ws.Status) != bashtaskv1alpha1.WorkspaceReady || r.canSnapshot(ws) {
		return
	}
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceReady, ptr.Deref(ws.Status.Message, "")+noSnapshots)
}

// nodeLost says why the workspace's node counts as lost, or "": its agent
// unreachable for --agent-lost-after on the controller's monotonic clock
// (never an API timestamp against the local clock), or its Node deleted.
func (r *BashWorkspaceReconciler) nodeLost(ctx context.Context, node string) string {
	if a := r.agents.Agent(node); !a.Connected && a.UnreachableFor >= r.opts.AgentLostAfter {
		return fmt.Sprintf("the agent on node %s was unreachable for %s (--agent-lost-after %s); the workspace's files went with it", node, a.UnreachableFor.Round(time.Second), r.opts.AgentLostAfter)
	}
	var n corev1.Node
	if err := r.client.Get(ctx, types.NamespacedName{Name: node}, &n); apierrors.IsNotFound(err) {
		return fmt.Sprintf("node %s was deleted; the workspace's files went with it", node)
	}
	return ""
}

func (r *BashWorkspaceReconciler) setNodeLost(ws *bashtaskv1alpha1.BashWorkspace, msg string, p *workspacePass) {
	if r.suspendLost(ws, msg, p) {
		return
	}
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceNodeLost, msg)
	ws.Status.RunningTasks = nil
	p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonNodeLost, "Follow", "%s", msg)
}

// idle schedules the next look at a Ready workspace and suspends it or
// marks it for deletion when spec.idleTimeoutSeconds passed with no running
// task since status.lastTaskTime, or since it last became Ready (made or
// restored on its node) when that is later. A task of the workspace that
// has not finished (also one waiting to be dispatched) keeps it. A workspace a GitOps tool manages is never deleted
// for idleness: the tool's next sync would create it again, empty.
func (r *BashWorkspaceReconciler) idle(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) (reconcile.Result, error) {
	refresh := reconcile.Result{RequeueAfter: r.refreshInterval(ws)}
	timeout := ws.Spec.IdleTimeoutSeconds
	if timeout == nil || ptr.Deref(ws.Status.RunningTasks, 0) > 0 {
		return refresh, nil
	}
	since := ws.CreationTimestamp.Time
	if t := ws.Status.LastTaskTime; t != nil && t.After(since) {
		since = t.Time
	}
	if rf := ws.Status.RestoredFrom; rf != nil && rf.RestoreTime != nil && rf.RestoreTime.After(since) {
		since = rf.RestoreTime.Time // a restore is the start of a new stay on a node
	}
	// A workspace that took a while to be made on its node (a busy
	// agent, a node that came late) gets its whole idle timeout once it
	// is Ready, not what is left of it since creation.
	if c := meta.FindStatusCondition(ws.Status.Conditions, bashtaskv1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue && c.LastTransitionTime.After(since) {
		since = c.LastTransitionTime.Time
	}
	if wait := since.Add(time.Duration(*timeout) * time.Second).Sub(r.clock.Now()); wait > 0 {
		return reconcile.Result{RequeueAfter: min(wait, refresh.RequeueAfter)}, nil
	}
	// Read live, not from the cache: a task created a moment ago that the
	// cache has not seen yet would otherwise be dispatched to a copy the
	// suspend or the deletion is about to remove.
	active, err := r.hasUnfinishedTasks(ctx, r.apiReader, ws)
	if err != nil || active {
		return reconcile.Result{RequeueAfter: r.opts.WorkspaceRefreshInterval}, err
	}
	canSnapshot := slices.Contains(r.agents.Agent(ptr.Deref(ws.Status.NodeName, "")).Capabilities, "snapshots")
	switch action := ws.Spec.IdleAction; {
	case canSnapshot && ptr.Deref(action, bashtaskv1alpha1.WorkspaceIdleSuspend) == bashtaskv1alpha1.WorkspaceIdleSuspend:
		return r.suspend(ctx, ws, fmt.Sprintf("idle for %ds (spec.idleTimeoutSeconds)", *timeout), p)
	case ptr.Deref(action, "") == bashtaskv1alpha1.WorkspaceIdleSuspend:
		// Asked for, and impossible here: kept rather than deleted.
		if !r.keptIdle(ws) {
			p.afterSend(func() { r.markKept(ws) })
			p.event(corev1.EventTypeWarning, ReasonKeptPastIdleTimeout, "Suspend",
				"Not suspended after its idle timeout of %ds: the agent on node %s has no bucket the nodes share (--output-bucket-url) to snapshot to", *timeout, ptr.Deref(ws.Status.NodeName, ""))
		}
		return refresh, nil
	}
	// idleAction unset where no snapshot is possible, or Delete.
	if by := GitOpsManager(ws); by != "" {
		if !r.keptIdle(ws) {
			p.afterSend(func() { r.markKept(ws) })
			p.event(corev1.EventTypeNormal, ReasonKeptPastIdleTimeout, "Delete",
				"Not deleted after its idle timeout of %ds: it is managed by %s, whose next sync would create it again, empty. Remove it through the tool", *timeout, by)
		}
		return refresh, nil
	}
	p.deleteIdle = true
	return reconcile.Result{}, nil
}

// refreshInterval is the time until the next read of Ready workspace ws
// from its agent, with ws.Status as this pass read it there.
//
// A workspace that runs no task is quiet: its files, bytes used and egress
// refusals change only through a task, and a task's creation and each
// change of its phase reconcile the workspace (taskPhaseChanged), as do
// its agent's disconnect and return (AgentRegistryOptions.AgentChanged)
// and its Node's deletion. Such a workspace is read every
// WorkspaceIdleRefreshInterval, so that held workspaces cost the
// controller and the agents little while they wait (docs/scaling.md,
// "Live workspaces"). One with spec.egress.inject is not quiet: a changed
// Secret value reaches its agent at the next read.
func (r *BashWorkspaceReconciler) refreshInterval(ws *bashtaskv1alpha1.BashWorkspace) time.Duration {
	quiet := ptr.Deref(ws.Status.RunningTasks, 0) == 0 && (ws.Spec.Egress == nil || len(ws.Spec.Egress.Inject) == 0)
	if quiet && r.opts.WorkspaceIdleRefreshInterval > 0 {
		return r.opts.WorkspaceIdleRefreshInterval
	}
	return r.opts.WorkspaceRefreshInterval
}

// hasUnfinishedTasks reports whether a task naming ws has not finished,
// as reader (the cache, or the API server itself) lists the namespace's
// tasks: it runs only when an idle timeout is due or a suspended workspace
// is looked at.
func (r *BashWorkspaceReconciler) hasUnfinishedTasks(ctx context.Context, reader client.Reader, ws *bashtaskv1alpha1.BashWorkspace) (bool, error) {
	var list bashtaskv1alpha1.BashTaskList
	if err := reader.List(ctx, &list, client.InNamespace(ws.Namespace)); err != nil {
		return false, fmt.Errorf("listing the tasks of workspace %s: %w", klog.KObj(ws), err)
	}
	for i := range list.Items {
		t := &list.Items[i]
		if ptr.Deref(t.Spec.Workspace, "") == ws.Name && !isTerminal(t) && !ptr.Deref(t.Spec.Suspend, false) && t.DeletionTimestamp.IsZero() {
			return true, nil
		}
	}
	return false, nil
}

// deleteIdle deletes a workspace whose idle timeout passed; the UID
// precondition keeps a workspace made again under the same name safe.
func (r *BashWorkspaceReconciler) deleteIdle(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) error {
	if err := agentpool.Leading(r.opts.Fence, "delete"); err != nil {
		return fmt.Errorf("deleting idle workspace %s: %w", klog.KObj(ws), err)
	}
	uid := ws.UID
	if err := r.client.Delete(ctx, ws, client.Preconditions{UID: &uid}); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.recorder.Eventf(ws, nil, corev1.EventTypeNormal, ReasonIdleTimeout, "Delete", "Deleted after %ds without a running task", ptr.Deref(ws.Spec.IdleTimeoutSeconds, 0))
	return nil
}

// keptIdle reports whether this controller process sent ws (by UID) its
// KeptPastIdleTimeout event already: one event per workspace, not one
// per pass.
func (r *BashWorkspaceReconciler) keptIdle(ws *bashtaskv1alpha1.BashWorkspace) bool {
	r.keptMu.Lock()
	defer r.keptMu.Unlock()
	return r.kept[client.ObjectKeyFromObject(ws)] == ws.UID
}

// markKept records that ws's KeptPastIdleTimeout event was sent. It runs
// after the pass's status write, so that a pass whose write failed (a
// conflict) sends the event on the next one rather than never.
func (r *BashWorkspaceReconciler) markKept(ws *bashtaskv1alpha1.BashWorkspace) {
	r.keptMu.Lock()
	defer r.keptMu.Unlock()
	r.kept[client.ObjectKeyFromObject(ws)] = ws.UID
}

func (r *BashWorkspaceReconciler) forgetKept(key types.NamespacedName) {
	r.keptMu.Lock()
	delete(r.kept, key)
	r.keptMu.Unlock()
}

// workspaceLoad ranks agents for a new workspace by the workspaces their
// node holds already, from the cache.
func (r *BashWorkspaceReconciler) workspaceLoad(ctx context.Context) func(a *agentpool.AgentState) int {
	return func(a *agentpool.AgentState) int { return r.workspacesOn(ctx, a.Node) }
}

// workspaceNodeIndex names the index of the workspace informer's store
// that placement counts by: a workspace's status.nodeName.
const workspaceNodeIndex = "bashtask.dev/workspace-node"

// indexByNode adds workspaceNodeIndex to the workspace informer of c and
// keeps its store, so that placement counts a node's workspaces from the
// index's keys without listing (and copying) them. A cache whose informer
// has no store of its own (one per namespace) leaves r.byNode nil.
func (r *BashWorkspaceReconciler) indexByNode(c cache.Cache) error {
	inf, err := c.GetInformer(context.Background(), &bashtaskv1alpha1.BashWorkspace{})
	if err != nil {
		return fmt.Errorf("the BashWorkspace informer: %w", err)
	}
	if err := inf.AddIndexers(toolscache.Indexers{workspaceNodeIndex: workspaceNode}); err != nil {
		return fmt.Errorf("indexing BashWorkspaces by node for placement: %w", err)
	}
	if s, ok := inf.(interface{ GetIndexer() toolscache.Indexer }); ok {
		r.byNode = s.GetIndexer()
	}
	return nil
}

// workspaceNode is the index function of workspaceNodeIndex: a
// workspace's status.nodeName, none before it is placed.
func workspaceNode(o any) ([]string, error) {
	if ws, ok := o.(*bashtaskv1alpha1.BashWorkspace); ok && ptr.Deref(ws.Status.NodeName, "") != "" {
		return []string{*ws.Status.NodeName}, nil
	}
	return nil, nil
}

// workspacesOn counts the workspaces the cache places on node: the keys
// of workspaceNodeIndex, without a copy of any workspace, so that placing
// one workspace costs O(agents), not O(workspaces) (docs/scaling.md).
// Without the index it lists the cache without deep copies; 0 when that
// fails.
func (r *BashWorkspaceReconciler) workspacesOn(ctx context.Context, node string) int {
	if r.byNode != nil {
		if keys, err := r.byNode.IndexKeys(workspaceNodeIndex, node); err == nil {
			return len(keys)
		}
	}
	var list bashtaskv1alpha1.BashWorkspaceList
	if err := r.client.List(ctx, &list, client.MatchingFields{IndexWorkspaceNode: node}, client.UnsafeDisableDeepCopy); err != nil {
		return 0
	}
	return len(list.Items)
}

// reconcileDelete stops the workspace's running tasks and removes it from
// its node through the agent (DeleteWorkspace), then releases the object.
// The tasks end Cancelled through their own agent reports; tasks that had
// ended keep their status and output. A workspace whose node is lost, or
// was never placed, is released without the agent.
func (r *BashWorkspaceReconciler) reconcileDelete(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(ws, WorkspaceFinalizer) {
		return reconcile.Result{}, nil
	}
	node := ptr.Deref(ws.Status.NodeName, "")
	if node == "" {
		// The cache may lag behind this controller's write-ahead: only a
		// live read may say the workspace was never placed.
		fresh := &bashtaskv1alpha1.BashWorkspace{}
		if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(ws), fresh); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		if fresh.ResourceVersion != ws.ResourceVersion {
			return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil // the newer version's event follows
		}
		return reconcile.Result{}, r.removeFinalizer(ctx, ws)
	}
	was := workspacePhaseOf(&ws.Status)
	old := ws.Status.DeepCopy()
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceTerminating, "stopping its running tasks and removing it from node "+node)
	if err := r.writeStatus(ctx, ws, old); err != nil {
		return reconcile.Result{}, err
	}
	agent := r.agents.Agent(node)
	lost := ""
	switch {
	case agent.Connected:
	case was == bashtaskv1alpha1.WorkspaceNodeLost:
		lost = ptr.Deref(old.Message, "its node is lost")
	default:
		lost = r.nodeLost(ctx, node)
	}
	switch {
	case agent.Connected:
		n, err := r.agents.DeleteWorkspace(ctx, node, string(ws.UID))
		if err != nil {
			return reconcile.Result{}, fmt.Errorf("deleting workspace %s: %w", klog.KObj(ws), err)
		}
		if err := r.removeFinalizer(ctx, ws); err != nil {
			return reconcile.Result{}, err
		}
		r.recorder.Eventf(ws, nil, corev1.EventTypeNormal, ReasonDeleted, "Delete", "Removed from node %s; %d running tasks stopped", node, n)
	case lost != "":
		if err := r.removeFinalizer(ctx, ws); err != nil {
			return reconcile.Result{}, err
		}
		r.recorder.Eventf(ws, nil, corev1.EventTypeWarning, ReasonDeletedWithoutAgent, "Delete",
			"Deleted without its agent: %s. Whatever is left of it on node %s is not removed", lost, node)
	default:
		return reconcile.Result{RequeueAfter: max(r.opts.AgentLostAfter-agent.UnreachableFor, r.opts.RetryInterval)}, nil
	}
	return reconcile.Result{}, nil
}

// addFinalizer adds WorkspaceFinalizer with a patch, before the workspace
// is placed. Only then: a workspace the uninstall hook released
// (ReleaseTasks) keeps running without it.
func (r *BashWorkspaceReconciler) addFinalizer(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) error {
	if controllerutil.ContainsFinalizer(ws, WorkspaceFinalizer) {
		return nil
	}
	if err := agentpool.Leading(r.opts.Fence, "finalizer"); err != nil {
		return fmt.Errorf("adding finalizer to %s: %w", klog.KObj(ws), err)
	}
	patch := client.MergeFromWithOptions(ws.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(ws, WorkspaceFinalizer)
	if err := r.client.Patch(ctx, ws, patch); err != nil {
		return fmt.Errorf("adding finalizer to %s: %w", klog.KObj(ws), err)
	}
	return nil
}

func (r *BashWorkspaceReconciler) removeFinalizer(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) error {
	if !controllerutil.ContainsFinalizer(ws, WorkspaceFinalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(ws.DeepCopy(), client.MergeFromWithOptimisticLock{})
	r.forgetRefusals(ws.UID)
	r.injected.Delete(ws.UID)
	controllerutil.RemoveFinalizer(ws, WorkspaceFinalizer)
	if err := r.client.Patch(ctx, ws, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer from %s: %w", klog.KObj(ws), err)
	}
	return nil
}

// writeStatus writes ws's status through the status subresource when it
// differs from old, with the kstatus conditions derived from the phase.
// The write carries ws's resourceVersion, so a status computed from a
// stale view is refused with a conflict.
func (r *BashWorkspaceReconciler) writeStatus(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, old *bashtaskv1alpha1.BashWorkspaceStatus) error {
	ws.Status.ObservedGeneration = ptr.To(ws.Generation)
	setWorkspaceConditions(ws)
	if equality.Semantic.DeepEqual(old, &ws.Status) {
		return nil
	}
	if err := agentpool.Leading(r.opts.Fence, "status"); err != nil {
		return fmt.Errorf("writing the status of %s: %w", klog.KObj(ws), err)
	}
	if err := r.client.Status().Update(ctx, ws); err != nil {
		return fmt.Errorf("writing the status of %s: %w", klog.KObj(ws), err)
	}
	return nil
}
