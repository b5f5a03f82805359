package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Agents is what the reconciler needs from the node agents. AgentRegistry
// implements it over mTLS gRPC.
type Agents interface {
	// Agents returns the state of every known agent.
	Agents() []agentpool.AgentState
	// Agent returns the state of one node's agent.
	Agent(node string) agentpool.AgentState
	// StartTask starts a task; idempotent on the task UID.
	StartTask(ctx context.Context, node string, spec *agentv1.TaskSpec) (*agentv1.TaskStatus, error)
	// GetTask returns a task's status or an error wrapping ErrTaskUnknown.
	GetTask(ctx context.Context, node, uid string) (*agentv1.TaskStatus, error)
	// CancelTask stops a task; idempotent.
	CancelTask(ctx context.Context, node, uid string) (*agentv1.TaskStatus, error)
	// ForgetTask lets the agent drop a finished task once uploaded.
	ForgetTask(ctx context.Context, node, uid string) (bool, error)
	// Holds reports whether the node's agent still keeps the task.
	Holds(node, uid string) bool
	// Latest returns the newest reported status of a task, if any.
	Latest(node, uid string) (*agentv1.TaskStatus, bool)
}

// Options are the reconciler's tunables; each is a flag of
// bashtask-controller.
type Options struct {
	// MaxRunningPerOwner caps the running tasks of one spec.owner; 0 means
	// no cap.
	MaxRunningPerOwner int
	// FairShare hands an agent's free task slots to the tasks waiting for
	// them in fair turns: the task whose owner runs the fewest tasks
	// first, then the one that waited longest (docs/controller.md, "Fair
	// turns"). Off, a freed slot goes to whichever waiting task retries
	// first.
	FairShare bool
	// ProgressInterval is the shortest time between two tail refreshes of a
	// running task's status.
	ProgressInterval time.Duration
	// AgentLostAfter is how long an agent may be without a working stream,
	// on the controller's monotonic clock, before its running tasks become
	// AgentLost.
	AgentLostAfter time.Duration
	// StatusBudgetBytes caps the JSON encoding of a task's status.
	StatusBudgetBytes int
	// MaxTimeoutSeconds is the longest timeout a task may ask for, in
	// seconds (spec.timeoutSeconds, or spec.timeoutMilliseconds): a task
	// over it ends InvalidSpec before dispatch, and a task that asks for
	// none gets the default 120 s or this, whichever is less. 0 or less
	// is no cap.
	MaxTimeoutSeconds int32
	// DefaultTTLSecondsAfterFinished applies when a task sets no
	// ttlSecondsAfterFinished, in seconds after its completionTime; nil
	// keeps such tasks. DefaultOptions sets DefaultFinishedTaskTTLSeconds.
	DefaultTTLSecondsAfterFinished *int32
	// RetryInterval is how soon a task waiting for a reference, an agent or
	// an owner slot is looked at again.
	RetryInterval time.Duration
	// TTLDeletesGitOpsManaged lets the TTL delete tasks a GitOps tool
	// manages (see GitOpsManager); by default they are kept, since the
	// tool would create them again and re-run their command.
	TTLDeletesGitOpsManaged bool
	// RunningStatusDelay holds back the first Running status write of a
	// task for this long after dispatch: a task that finishes sooner gets
	// its terminal status directly, one write instead of two.
	RunningStatusDelay time.Duration
	// OrphanCheckInterval is the time between two checks of every task
	// the agents hold against the API (see OrphanCollector); zero or less
	// leaves only the checks on connect and on deletion.
	OrphanCheckInterval time.Duration
	// WorkspaceRefreshInterval is the time between two reads of a Ready
	// workspace's state on its agent (bytes used, running tasks) when no
	// task of it changed meanwhile.
	WorkspaceRefreshInterval time.Duration
	// WorkspaceIdleRefreshInterval replaces WorkspaceRefreshInterval for
	// a Ready workspace that runs no task and injects no Secret into its
	// egress (spec.egress.inject): nothing on its agent changes until a
	// task of it starts, its agent disconnects or comes back, or its Node
	// goes, and each of those reconciles it at once. Zero or less uses
	// WorkspaceRefreshInterval (docs/scaling.md, "Live workspaces").
	WorkspaceIdleRefreshInterval time.Duration
	// WorkspaceSnapshotAfterTask is how long after its last task ended a
	// workspace that changed since its last snapshot is snapshotted,
	// when its spec.snapshot.afterTaskSeconds is unset; zero or less
	// turns it off (docs/workspaces.md, "Snapshots").
	WorkspaceSnapshotAfterTask time.Duration
	// AgentTolerations are the tolerations of the agent's pods as the
	// user configured them (--agent-tolerations, rendered by the chart
	// from agent.tolerations, without the ones the DaemonSet controller
	// adds): a node with a NoSchedule or NoExecute taint none of them
	// tolerates gets no new task or workspace (see nodeUnschedulable).
	AgentTolerations []corev1.Toleration
	// Records, when set, keeps the record of a finished task in the output
	// bucket before its finalizer is removed, so that its output stays
	// readable once the object is gone (docs/output.md, "After the task is
	// deleted"). Not a flag: the binary opens it from --output-bucket-url.
	Records TaskRecords
	// Fence, when set (leader election on), is asked before every status
	// write and before a task's finalizer is added: while this controller
	// is not sure it leads, it writes nothing (see LeaderFence). Not a
	// flag: the binary sets it from its leader election.
	Fence agentpool.Fencer
}

// DefaultFinishedTaskTTLSeconds is the default of
// --default-ttl-seconds-after-finished, in seconds: an hour, the TTL the
// plugin and the Go client already give the tasks they create. etcd then
// holds at most an hour of finished tasks, the rate of creates times an
// hour times a task's size (about 3 KiB, more with long status tails):
// docs/performance.md, "Finished tasks and etcd". The output outlives the
// object in the output bucket (docs/output.md, "After the task is
// deleted").
const DefaultFinishedTaskTTLSeconds int32 = 60 * 60

// DefaultOptions returns the flag defaults of bashtask-controller.
func DefaultOptions() Options {
	return Options{
		ProgressInterval:    5 * time.Second,
		AgentLostAfter:      60 * time.Second,
		StatusBudgetBytes:   DefaultStatusBudgetBytes,
		MaxTimeoutSeconds:   600,
		RetryInterval:       2 * time.Second,
		FairShare:           true,
		RunningStatusDelay:  500 * time.Millisecond,
		OrphanCheckInterval: time.Minute,

		DefaultTTLSecondsAfterFinished: ptr.To(DefaultFinishedTaskTTLSeconds),

		WorkspaceRefreshInterval:     30 * time.Second,
		WorkspaceIdleRefreshInterval: 10 * time.Minute,
		WorkspaceSnapshotAfterTask:   5 * time.Minute,
	}
}

// BashTaskReconciler reconciles BashTasks through the node agents: it
// resolves references, applies the per-owner limit, places each task,
// records the placement before dispatch (write-ahead), starts it, and
// follows the agent's reports into status until the task is terminal.
type BashTaskReconciler struct {
	client    client.Client
	apiReader client.Reader
	agents    Agents
	recorder  events.EventRecorder
	clock     clock.PassiveClock
	opts      Options
	metrics   *Metrics

	ownerMu  sync.Mutex
	reserved map[string]map[types.UID]bool // owner -> tasks admitted, not yet dispatched in the cache

	// fair holds the task slots of placed tasks and the turns of the
	// tasks waiting for one.
	fair *fairShare

	progressMu sync.Mutex
	progress   map[types.UID]time.Time // last progress write per running task
	started    map[types.UID]time.Time // when this process dispatched the task

	keptMu sync.Mutex
	kept   map[types.NamespacedName]types.UID // managed tasks kept past their TTL, with the event sent

	// written holds, per task, the resourceVersion of this process's last
	// write that the cache has not shown yet (read-your-writes).
	written *writeTracker
}

// NewBashTaskReconciler returns a reconciler. c is the manager's cached
// client; apiReader reads Secrets and ConfigMaps uncached (the controller
// may get them, not list them); m may be nil.
func NewBashTaskReconciler(c client.Client, apiReader client.Reader, agents Agents, recorder events.EventRecorder, clk clock.PassiveClock, opts Options, m *Metrics) *BashTaskReconciler {
	return &BashTaskReconciler{
		client: c, apiReader: apiReader, agents: agents, recorder: recorder, clock: clk, opts: opts, metrics: m,
		reserved: map[string]map[types.UID]bool{},
		fair:     newFairShare(opts.FairShare),
		progress: map[types.UID]time.Time{},
		started:  map[types.UID]time.Time{},
		kept:     map[types.NamespacedName]types.UID{},
		written:  newWriteTracker(),
	}
}

// SetupWithManager registers the reconciler, its cache indexes and its
// event sources: BashTask changes, agent task events (agentEvents), the
// release of an owner slot, the changes of BashWorkspaces and Nodes that
// tasks wait for, a slot freed on an agent and the turns of waiting tasks
// (see fairShare).
func (r *BashTaskReconciler) SetupWithManager(mgr ctrl.Manager, agentEvents <-chan event.TypedGenericEvent[*bashtaskv1alpha1.BashTask], workers int) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &bashtaskv1alpha1.BashTask{}, IndexOwner,
		func(o client.Object) []string {
			if owner := ptr.Deref(o.(*bashtaskv1alpha1.BashTask).Spec.Owner, ""); owner != "" {
				return []string{owner}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("indexing BashTasks by %s: %w", IndexOwner, err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &bashtaskv1alpha1.BashTask{}, IndexWorkspace,
		func(o client.Object) []string {
			if ws := ptr.Deref(o.(*bashtaskv1alpha1.BashTask).Spec.Workspace, ""); ws != "" {
				return []string{ws}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("indexing BashTasks by %s: %w", IndexWorkspace, err)
	}
	if err := indexRunningOwner(mgr); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		// A task created while the controller runs is queued behind the
		// events of the tasks already under way (newTasksLast).
		For(&bashtaskv1alpha1.BashTask{}, builder.WithPredicates(notNewTask())).
		Watches(&bashtaskv1alpha1.BashTask{}, newTasksLast()).
		Named("bashtask").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Watches(&bashtaskv1alpha1.BashTask{}, handler.EnqueueRequestsFromMapFunc(r.waitingForOwnerSlot)).
		Watches(&bashtaskv1alpha1.BashWorkspace{}, handler.EnqueueRequestsFromMapFunc(r.tasksWaitingForWorkspace)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.tasksWaitingForNode), builder.WithPredicates(nodeSchedulingChanged())).
		Watches(&bashtaskv1alpha1.BashTask{}, handler.EnqueueRequestsFromMapFunc(r.nextInTurn), builder.WithPredicates(slotFreed())).
		WatchesRawSource(source.Channel(r.fair.wake, &handler.TypedEnqueueRequestForObject[*bashtaskv1alpha1.BashTask]{}))
	if agentEvents != nil {
		b = b.WatchesRawSource(source.Channel(agentEvents, &handler.TypedEnqueueRequestForObject[*bashtaskv1alpha1.BashTask]{}))
	}
	return b.Complete(r)
}

// waitingForOwnerSlot maps a task that no longer occupies an owner slot to
// the same owner's tasks waiting for one.
func (r *BashTaskReconciler) waitingForOwnerSlot(ctx context.Context, o client.Object) []reconcile.Request {
	bt, ok := o.(*bashtaskv1alpha1.BashTask)
	if !ok || r.opts.MaxRunningPerOwner <= 0 || !isTerminal(bt) {
		return nil
	}
	owner := ptr.Deref(bt.Spec.Owner, "")
	if owner == "" {
		return nil
	}
	var list bashtaskv1alpha1.BashTaskList
	if err := r.client.List(ctx, &list, client.InNamespace(bt.Namespace), client.MatchingFields{IndexOwner: owner}); err != nil {
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

// Reconcile moves one task one step towards its terminal state.
//
// A pass reads the task, releases one deleted before it was dispatched,
// copies its status, and runs the one phase function the task's state
// selects: reconcilePending (not dispatched yet), reconcileDispatched (on
// an agent, not terminal) or reconcileFinished (terminal). A phase changes
// the status in memory, makes the agent calls it needs and returns a
// taskDecision; it never calls another phase. The status is then written
// once, at the end of the pass and only if it changed, and the pass's
// events and the steps that must follow a recorded status (an agent's
// Forget, the finalizer, the TTL) run only after that write succeeded: an
// event never announces what the API does not show, and an agent drops
// its copy of a task only once the status says where the output went.
//
// A phase that ends a task leaves the rest to the next pass, which the
// watch event of that terminal write brings: reconcileFinished then works
// from the terminal status as stored.
//
// The single exception to one write per pass is the write-ahead in
// reconcilePending (see writeAhead): the chosen node is written before the
// agent is asked to Start, so that a controller that stops between the two
// finds the node recorded and cannot start the task twice.
func (r *BashTaskReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	bt := &bashtaskv1alpha1.BashTask{}
	if err := r.client.Get(ctx, req.NamespacedName, bt); err != nil {
		if apierrors.IsNotFound(err) {
			r.written.forget(req.NamespacedName)
			r.forgetKept(req.NamespacedName)
			r.fair.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("uid", bt.UID, "phase", phaseOf(&bt.Status), "node", nodeOf(&bt.Status))
	ctx = ctrl.LoggerInto(ctx, log)
	if r.written.stale(req.NamespacedName, bt.ResourceVersion) {
		// This process wrote a newer version than the cache holds: a pass
		// on this copy would redo work already done (a second dispatch
		// attempt that ends in a conflict, a live read). The watch event
		// of that newer version is still to come and triggers the next
		// pass, so nothing needs requeueing.
		log.V(1).Info("Cache behind this controller's last write; waiting for it", "resourceVersion", bt.ResourceVersion)
		return reconcile.Result{}, nil
	}
	res, err := r.reconcile(ctx, bt)
	if apierrors.IsConflict(err) {
		// The cache was behind the object: nothing computed from it was
		// stored. The watch event of the newer version triggers the next
		// pass, which starts from fresh state; the requeue is the safety
		// net should that event have been coalesced into this pass. It
		// costs a read of the cache, never a write.
		log.V(1).Info("Stale object; waiting for the newer version", "err", err)
		return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, nil
	}
	return res, err
}

// reconcile is one pass on bt: the finalizer of a task deleted before
// dispatch, then one phase, one status write, then what the decision owes
// once the status is recorded.
func (r *BashTaskReconciler) reconcile(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (reconcile.Result, error) {
	if !bt.DeletionTimestamp.IsZero() && !isDispatched(bt) && !isTerminal(bt) {
		// Nothing was started, so nothing is left to stop. The finalizer
		// is only added just before the write-ahead (a task that never
		// dispatches costs no write for it), and removed here.
		return reconcile.Result{}, r.removeFinalizer(ctx, bt)
	}
	if isDispatched(bt) || isTerminal(bt) {
		r.fair.seen(client.ObjectKeyFromObject(bt), isTerminal(bt))
	}
	old := bt.Status.DeepCopy()
	var d taskDecision
	var err error
	switch {
	case isTerminal(bt):
		d, err = r.reconcileFinished(ctx, bt)
	case isDispatched(bt):
		d, err = r.reconcileDispatched(ctx, bt, old)
	default:
		d, err = r.reconcilePending(ctx, bt, old)
	}
	if d.write != "" {
		if werr := r.writeStatus(ctx, bt, old, d.write); werr != nil {
			return reconcile.Result{}, errors.Join(werr, err)
		}
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	return r.afterWrite(ctx, bt, d)
}

// afterWrite runs what d owes once the pass's status is recorded: the
// progress throttle's stamp, the events, the finish metric and the steps
// of a finished task.
func (r *BashTaskReconciler) afterWrite(ctx context.Context, bt *bashtaskv1alpha1.BashTask, d taskDecision) (reconcile.Result, error) {
	if d.progress {
		r.progressMu.Lock()
		r.progress[bt.UID] = r.clock.Now()
		r.progressMu.Unlock()
	}
	for _, e := range d.events {
		r.recorder.Eventf(bt, nil, e.typ, e.reason, e.action, "%s", e.note)
	}
	if d.finished && r.metrics != nil {
		r.metrics.observeFinish(bt)
	}
	if d.finish != nil {
		if err := r.finish(ctx, bt, *d.finish); err != nil {
			return reconcile.Result{}, err
		}
	}
	return d.result, nil
}

// isTerminal reports whether the task has its terminal reason.
func isTerminal(bt *bashtaskv1alpha1.BashTask) bool { return reasonOf(&bt.Status) != "" }

// isDispatched reports whether the task was recorded on an agent.
func isDispatched(bt *bashtaskv1alpha1.BashTask) bool {
	return nodeOf(&bt.Status) != "" && bt.Status.Agent != nil
}

// reconcilePending is the phase of a task not yet dispatched: it waits for
// what the task needs (its workspace, its references, an owner slot, an
// agent), or ends it when waiting cannot help, and else records the
// placement (write-ahead) and starts the task. old is updated by the
// write-ahead.
func (r *BashTaskReconciler) reconcilePending(ctx context.Context, bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus) (taskDecision, error) {
	now := r.clock.Now()
	// A pass that ends before the placement waits for something else than
	// a slot: the task leaves the turns until it waits for one again.
	placing := false
	defer func() {
		if !placing {
			r.fair.leave(client.ObjectKeyFromObject(bt))
		}
	}()
	if d := specGate(bt, now); d != nil {
		return *d, nil
	}
	if msg := imageReferenceError(bt.Spec.Image); msg != "" {
		return *endDecision(bt, bashtaskv1alpha1.ReasonInvalidSpec, msg, now), nil
	}
	if d := timeoutGate(bt, r.opts.MaxTimeoutSeconds, now); d != nil {
		return *d, nil
	}
	var target *workspaceTarget
	if ptr.Deref(bt.Spec.Workspace, "") != "" {
		c, err := r.checkWorkspace(ctx, bt)
		if err != nil {
			return taskDecision{}, err
		}
		if d := workspaceGate(bt, c, now); d != nil {
			return *d, nil
		}
		target = c.target
	}
	resolved, err := r.resolve(ctx, bt)
	if d := resolveGate(bt, old, err, now, r.opts.RetryInterval); d != nil {
		return *d, nil
	}
	if err != nil {
		return taskDecision{}, err
	}
	release, admitted, err := r.admitOwner(ctx, bt)
	if err != nil {
		return taskDecision{}, err
	}
	if !admitted {
		setPending(bt, ReasonOwnerLimit, fmt.Sprintf("owner %q already runs %d tasks, the --max-running-per-owner limit", ptr.Deref(bt.Spec.Owner, ""), r.opts.MaxRunningPerOwner))
		return taskDecision{write: "pending", result: reconcile.Result{RequeueAfter: r.opts.RetryInterval}}, nil
	}
	placing = true
	agent, d, err := r.choose(ctx, bt, target, resolved, now)
	if agent == nil {
		release()
		return d, err
	}
	releaseOwner := release
	release = func() {
		releaseOwner()
		r.fair.drop(client.ObjectKeyFromObject(bt))
	}
	if err := r.restoreNotice(ctx, bt, target); err != nil {
		release()
		return taskDecision{}, err
	}
	if target != nil {
		bt.Status.Image = target.image // the workspace's image, recorded with the dispatch
	}
	// The documented exception to one status write per pass, at its end
	// (see Reconcile): the placement is written here, before Start, so
	// that a crash between the two leaves the node recorded and the task
	// can never be started twice, or elsewhere, unrecorded. It says
	// already which limits the node does not enforce.
	unenforced := limitsEvents(old, dispatchLimits(bt, agent), "Dispatch")
	if err := r.writeAhead(ctx, bt, old, agent); err != nil {
		release()
		return taskDecision{}, err
	}
	// No event here: the Scheduled condition records the dispatch, and a
	// short task would pay one more API write for it. A task's events are
	// Started (only for one still running after --running-status-delay),
	// its outcome (every failure; a success after a Started), limits its
	// node does not enforce, and anomalies. The write-ahead is recorded,
	// so the last may go with the pass's own.
	d, err = r.start(ctx, bt, resolved, old)
	d.events = append(unenforced, d.events...)
	return d, err
}

// dispatchLimits records on bt, about to be dispatched to agent, the
// limits it asks for that agent's node does not enforce (setLimitsStatus),
// as the agent's readiness reports them. It returns bt.
func dispatchLimits(bt *bashtaskv1alpha1.BashTask, agent *agentpool.AgentState) *bashtaskv1alpha1.BashTask {
	bt.Status.NodeName = ptr.To(agent.Node)
	setLimitsStatus(bt, notEnforcedOn(bt, agent))
	return bt
}

// choose places the task in its turn (takeTurn), on its workspace's node
// (whatever that node's scheduling state: the task goes where the files
// are, see docs/workspaces.md) or by placementRequest, and checks that the agent would accept
// its Start. It returns the agent, or nil and the decision of a task that
// waits or ends. The size check comes before the write-ahead: a task the
// agent would refuse is never dispatched, and the message says by how
// much it is over.
func (r *BashTaskReconciler) choose(ctx context.Context, bt *bashtaskv1alpha1.BashTask, target *workspaceTarget, resolved *resolvedInput, now time.Time) (*agentpool.AgentState, taskDecision, error) {
	if target != nil {
		resolved.workspace = target.ref
	}
	pl, err := r.takeTurn(ctx, bt, target, now)
	if err != nil {
		return nil, taskDecision{}, err
	}
	if d := placementGate(bt, pl, now, r.opts.RetryInterval); d != nil {
		return nil, *d, nil
	}
	if msg := startSizeError(r.taskSpecOn(bt, resolved, pl.agent.Node), pl.agent); msg != "" {
		r.fair.drop(client.ObjectKeyFromObject(bt))
		setTerminal(bt, bashtaskv1alpha1.ReasonInvalidSpec, msg, now)
		return nil, taskDecision{write: "terminal"}, nil
	}
	return pl.agent, taskDecision{}, nil
}

// writeAhead adds the finalizer and records the placement on agent before
// Start is called: the one status write of a pass that is not its last
// (see Reconcile). The write is conditional on the resourceVersion read,
// so a stale cache or a second controller loses the race here with a
// conflict instead of starting the task elsewhere, and a controller that
// stops after it finds the node the task may run on: dispatch is
// at-most-once. old becomes the status written, which the pass's final
// write compares with.
func (r *BashTaskReconciler) writeAhead(ctx context.Context, bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus, agent *agentpool.AgentState) error {
	if !controllerutil.ContainsFinalizer(bt, Finalizer) {
		if err := r.leading("finalizer"); err != nil {
			return fmt.Errorf("dispatching %s: %w", klog.KObj(bt), err)
		}
		controllerutil.AddFinalizer(bt, Finalizer)
		if err := r.client.Update(ctx, bt); err != nil {
			return fmt.Errorf("adding finalizer to %s: %w", klog.KObj(bt), err)
		}
		r.written.wrote(bt)
	}
	bt.Status.NodeName = ptr.To(agent.Node)
	bt.Status.Agent = &bashtaskv1alpha1.AgentRef{Pod: optional(agent.Pod), Incarnation: optional(agent.Incarnation)}
	bt.Status.Phase = ptr.To(bashtaskv1alpha1.PhasePending)
	setCondition(bt, bashtaskv1alpha1.ConditionScheduled, true, ReasonDispatched, fmt.Sprintf("dispatched to the agent on node %s", agent.Node))
	if err := r.writeStatus(ctx, bt, old, "dispatch"); err != nil {
		return err
	}
	*old = *bt.Status.DeepCopy()
	return nil
}

// start sends a written-ahead task to its agent and decides on the reply.
// resolved is nil when the pass that wrote the dispatch is not this one
// (a controller restarted in between, a Start whose reply was lost): the
// references are read again then. old is the status as last written.
func (r *BashTaskReconciler) start(ctx context.Context, bt *bashtaskv1alpha1.BashTask, resolved *resolvedInput, old *bashtaskv1alpha1.BashTaskStatus) (taskDecision, error) {
	// Whatever the outcome, the slot held since the placement is now the
	// registry's to count (a task started) or free (one that was not).
	defer r.fair.started(client.ObjectKeyFromObject(bt))
	if resolved == nil {
		var d *taskDecision
		var err error
		if resolved, d, err = r.resolveAgain(ctx, bt); d != nil || err != nil {
			return ptr.Deref(d, taskDecision{}), err
		}
	}
	spec := r.taskSpec(bt, resolved)
	node := nodeOf(&bt.Status)
	if agent := r.agents.Agent(node); agent.Connected {
		// The values may have changed since the dispatch was written.
		if msg := startSizeError(spec, &agent); msg != "" {
			setTerminal(bt, bashtaskv1alpha1.ReasonInvalidSpec, msg, r.clock.Now())
			return taskDecision{write: "terminal"}, nil
		}
	}
	ts, err := r.agents.StartTask(ctx, node, spec)
	if d, ok := imageStartDecision(bt, err, r.clock.Now()); ok {
		return d, nil
	}
	if status.Code(err) == codes.ResourceExhausted {
		// The agent runs its maximum (or has no task UID left) and
		// started nothing: this controller's count was behind the
		// agent's. The task waits for a slot on the node it is recorded
		// on, in turn with the tasks not yet placed (startTurn), woken
		// when a slot there frees; the retry is the safety net.
		ctrl.LoggerFrom(ctx).V(1).Info("Agent at capacity; waiting for a slot in turn", "node", node, "err", err)
		r.fair.refused(bt, node, r.clock.Now())
		retry := r.opts.RetryInterval
		if !r.fair.enabled {
			retry /= 4
		}
		return taskDecision{result: reconcile.Result{RequeueAfter: retry}}, nil
	}
	if err != nil {
		// The task stays assigned to this agent: Start is idempotent on the
		// UID, so retrying there can never run it twice.
		return taskDecision{}, fmt.Errorf("dispatching %s: %w", klog.KObj(bt), err)
	}
	now := r.clock.Now()
	if r.metrics != nil {
		r.metrics.observeDispatch(bt, now)
	}
	r.progressMu.Lock()
	r.started[bt.UID] = now
	r.progressMu.Unlock()
	r.applyTaskStatus(bt, ts)
	return r.reported(bt, old), nil
}

// resolveAgain reads a dispatched task's references and workspace for a
// Start the dispatching pass did not make. It returns the decision of a
// task that can no longer start: a value removed since the dispatch cannot
// be waited for on an assigned node, and a workspace deleted since ends
// its tasks Cancelled.
func (r *BashTaskReconciler) resolveAgain(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (*resolvedInput, *taskDecision, error) {
	resolved, err := r.resolve(ctx, bt)
	if err != nil {
		setTerminal(bt, bashtaskv1alpha1.ReasonInvalidSpec, fmt.Sprintf("resolving values for dispatch: %v", err), r.clock.Now())
		return nil, &taskDecision{write: "terminal"}, nil
	}
	ref, gone, err := r.workspaceRef(ctx, bt)
	if err != nil {
		return nil, nil, err
	}
	if gone != "" {
		setTerminal(bt, bashtaskv1alpha1.ReasonCancelled, gone, r.clock.Now())
		return nil, &taskDecision{write: "terminal"}, nil
	}
	resolved.workspace = ref
	return resolved, nil, nil
}

// reconcileDispatched is the phase of a task on an agent that has not
// ended: it follows the agent's reports into status, cancels on request,
// ends the task when its agent is lost or restarted without it, and
// starts it again where Start never arrived.
func (r *BashTaskReconciler) reconcileDispatched(ctx context.Context, bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus) (taskDecision, error) {
	node := nodeOf(&bt.Status)
	agent := r.agents.Agent(node)
	if !agent.Connected {
		return unreachableDecision(bt, agent, r.opts.AgentLostAfter, r.clock.Now()), nil
	}
	incarnation := ptr.Deref(bt.Status.Agent.Incarnation, "")
	uid := string(bt.UID)
	var ts *agentv1.TaskStatus
	var err error
	if latest, ok := r.agents.Latest(node, uid); ok && agent.Incarnation == incarnation {
		// The Watch stream already delivered the report that triggered
		// this pass; asking again would only add a round trip.
		ts = latest
	} else {
		ts, err = r.agents.GetTask(ctx, node, uid)
	}
	switch {
	case errors.Is(err, agentpool.ErrTaskUnknown) && agent.Incarnation == incarnation:
		return r.notStarted(ctx, bt, old)
	case errors.Is(err, agentpool.ErrTaskUnknown):
		setTerminal(bt, bashtaskv1alpha1.ReasonAgentRestarted,
			fmt.Sprintf("the agent on node %s restarted (incarnation %s, was %s) and has no record of the task", node, agent.Incarnation, incarnation), r.clock.Now())
		return taskDecision{write: "terminal"}, nil
	case err != nil:
		return taskDecision{}, err
	}
	if ts.GetState() == agentv1.TaskState_TASK_STATE_RUNNING && (!bt.DeletionTimestamp.IsZero() || ptr.Deref(bt.Spec.CancelRequested, false)) {
		if ts, err = r.agents.CancelTask(ctx, node, uid); err != nil {
			return taskDecision{}, err
		}
	}
	r.applyTaskStatus(bt, ts)
	return r.reported(bt, old), nil
}

// notStarted handles a dispatched task its agent's incarnation does not
// know. Either Start never reached this incarnation (the controller
// stopped between the write-ahead and Start, or the reply was lost), or
// the task finished, its terminal status was written and the agent forgot
// it, and the cache has not caught up. Only a live read tells them apart;
// starting in the second case would run the command twice.
func (r *BashTaskReconciler) notStarted(ctx context.Context, bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus) (taskDecision, error) {
	fresh := &bashtaskv1alpha1.BashTask{}
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(bt), fresh); err != nil {
		return taskDecision{}, client.IgnoreNotFound(err)
	}
	if fresh.ResourceVersion != bt.ResourceVersion || isTerminal(fresh) {
		return taskDecision{}, nil // the watch event of the newer version follows
	}
	if !bt.DeletionTimestamp.IsZero() || ptr.Deref(bt.Spec.CancelRequested, false) {
		setTerminal(bt, bashtaskv1alpha1.ReasonCancelled, "cancelled before the agent started it", r.clock.Now())
		return taskDecision{write: "terminal"}, nil
	}
	turn, err := r.startTurn(ctx, bt, nodeOf(&bt.Status), r.clock.Now())
	if err != nil {
		return taskDecision{}, err
	}
	if !turn {
		return taskDecision{result: reconcile.Result{RequeueAfter: r.opts.RetryInterval}}, nil
	}
	return r.start(ctx, bt, nil, old)
}

// reported decides on the status an agent's report produced (see
// reportDecision), with this process's record of when it dispatched the
// task and last wrote its progress.
func (r *BashTaskReconciler) reported(bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus) taskDecision {
	r.progressMu.Lock()
	started, dispatched := r.started[bt.UID]
	last, written := r.progress[bt.UID]
	r.progressMu.Unlock()
	d := reportDecision(bt, old, reportTimes{
		now: r.clock.Now(), started: started, dispatched: dispatched, lastProgress: last, progressWritten: written,
	}, r.opts.RunningStatusDelay, r.opts.ProgressInterval)
	if d.write != "" {
		// The agent's report of the task may name other limits than its
		// readiness did at dispatch.
		d.events = append(limitsEvents(old, bt, "Start"), d.events...)
	}
	return d
}

// runningResync is how often a running task is looked at without an agent
// event.
const runningResync = 30 * time.Second

// reconcileFinished is the phase of a terminal task: it records that a
// spec change was seen and the uploads that finish after the terminal
// report, and plans what follows the recorded status (the agent's Cancel
// or Forget, the finalizer, the TTL; see planFinish).
func (r *BashTaskReconciler) reconcileFinished(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (taskDecision, error) {
	r.forgetProgress(bt.UID)
	node := nodeOf(&bt.Status)
	agent := agentpool.AgentState{}
	if isDispatched(bt) {
		agent = r.agents.Agent(node)
	}
	// Whichever incarnation of the node's agent is connected now: a task
	// the agent recovered after a restart is held, uploaded and finally
	// forgotten by the new incarnation, under the same UID. Forget by UID is
	// safe on any incarnation: one that does not hold the task ignores it,
	// and one that still runs it refuses.
	connected := agent.Connected

	var d taskDecision
	if ptr.Deref(bt.Status.ObservedGeneration, 0) != bt.Generation && bt.DeletionTimestamp.IsZero() {
		// A spec change after the end (cancelRequested, suspend, the TTL)
		// changes nothing in the outcome, but the status must say it was
		// seen: tools compare generation and observedGeneration.
		d.write = "observed"
	}
	if connected && uploadPending(bt) {
		// Uploads finish after the terminal report; follow them into the
		// spill references. The terminal reason never changes here.
		ts, ok := r.agents.Latest(node, string(bt.UID))
		var err error
		if !ok {
			ts, err = r.agents.GetTask(ctx, node, string(bt.UID))
		}
		switch {
		case err == nil:
			before := bt.Status.DeepCopy()
			applyUploads(bt, ts)
			if d.write == "" || !equality.Semantic.DeepEqual(before, &bt.Status) {
				d.write = "upload"
			}
		case !errors.Is(err, agentpool.ErrTaskUnknown):
			return d, err
		}
	}
	// Latest's ok is Holds: the connected agent still reports the task.
	ts, held := r.agents.Latest(node, string(bt.UID))
	plan, wait := planFinish(bt, finishState{
		held:       connected && !uploadPending(bt) && held,
		running:    ts.GetState() == agentv1.TaskState_TASK_STATE_RUNNING,
		uploading:  connected && uploadPending(bt),
		defaultTTL: r.opts.DefaultTTLSecondsAfterFinished,
		now:        r.clock.Now(),
	})
	d.finish = &plan
	d.result = reconcile.Result{RequeueAfter: wait}
	return d, nil
}

// finish carries out the plan of a finished task once its status is
// recorded (see finishPlan): the Forget only then, since an agent that
// forgot a task can no longer tell where its output went, and the event
// of a task kept past its TTL (keepManaged) only then too.
func (r *BashTaskReconciler) finish(ctx context.Context, bt *bashtaskv1alpha1.BashTask, p finishPlan) error {
	node, uid := nodeOf(&bt.Status), string(bt.UID)
	switch p.agent {
	case finishCancel:
		if _, err := r.agents.CancelTask(ctx, node, uid); err != nil && !errors.Is(err, agentpool.ErrTaskUnknown) {
			return err
		}
		return nil
	case finishForget:
		if _, err := r.agents.ForgetTask(ctx, node, uid); err != nil {
			return err
		}
	}
	switch {
	case p.removeFinalizer:
		if err := r.keepRecord(ctx, bt); err != nil {
			return err
		}
		return r.removeFinalizer(ctx, bt)
	case p.ttlDue && !r.keepManaged(bt, p.ttl):
		// The UID precondition keeps a task recreated under the same name safe.
		uid := bt.UID
		if err := r.client.Delete(ctx, bt, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s after its TTL: %w", klog.KObj(bt), err)
		}
	}
	return nil
}

func (r *BashTaskReconciler) removeFinalizer(ctx context.Context, bt *bashtaskv1alpha1.BashTask) error {
	if !controllerutil.ContainsFinalizer(bt, Finalizer) {
		return nil
	}
	controllerutil.RemoveFinalizer(bt, Finalizer)
	if err := r.client.Update(ctx, bt); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer from %s: %w", klog.KObj(bt), err)
	}
	return nil
}

// writeStatus writes bt's status through the status subresource when it
// differs from old, after fitting it into the status budget. kind labels
// the write in metrics.
//
// The write is an Update carrying bt's resourceVersion, the version old and
// the new status were computed from: when the object changed since (another
// pass, a metadata edit, an earlier leader), the API server refuses it with
// a conflict and Reconcile waits for the newer version's watch event, so a
// status computed from a stale view is never stored. guardStatus keeps the
// terminal fields as first written and refuses a status that would go
// backwards.
func (r *BashTaskReconciler) writeStatus(ctx context.Context, bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus, kind string) error {
	// Everything in the status is computed for this generation, also the
	// conditions this pass left as they were: tools compare each
	// condition's observedGeneration with the generation.
	bt.Status.ObservedGeneration = ptr.To(bt.Generation)
	restored, err := guardStatus(old, &bt.Status)
	if len(restored) > 0 || err != nil {
		if r.metrics != nil {
			for _, f := range restored {
				r.metrics.StatusRegressions.WithLabelValues(f).Inc()
			}
			if err != nil {
				r.metrics.StatusRegressions.WithLabelValues("refused").Inc()
			}
		}
		if len(restored) > 0 {
			ctrl.LoggerFrom(ctx).Info("Kept terminal status fields this pass would have changed", "kind", kind, "fields", restored)
		}
		if err != nil {
			return fmt.Errorf("writing %s status of %s: %w", kind, klog.KObj(bt), err)
		}
	}
	setReadiness(bt)
	for i := range bt.Status.Conditions {
		bt.Status.Conditions[i].ObservedGeneration = bt.Generation
	}
	if equality.Semantic.DeepEqual(old, &bt.Status) {
		return nil
	}
	if err := r.leading("status"); err != nil {
		return fmt.Errorf("writing %s status of %s: %w", kind, klog.KObj(bt), err)
	}
	if err := FitStatusBudget(&bt.Status, r.opts.StatusBudgetBytes); err != nil {
		return fmt.Errorf("fitting the status of %s into %d bytes: %w", klog.KObj(bt), r.opts.StatusBudgetBytes, err)
	}
	if err := r.client.Status().Update(ctx, bt); err != nil {
		return fmt.Errorf("writing %s status of %s: %w", kind, klog.KObj(bt), err)
	}
	r.written.wrote(bt)
	if r.metrics != nil {
		r.metrics.StatusWrites.WithLabelValues(kind).Inc()
	}
	return nil
}

// leading returns an error wrapping ErrNotLeader when this controller is
// not sure it leads; action names what it was about to do, for the metric.
func (r *BashTaskReconciler) leading(action string) error {
	return agentpool.Leading(r.opts.Fence, action)
}

func (r *BashTaskReconciler) forgetProgress(uid types.UID) {
	r.progressMu.Lock()
	delete(r.progress, uid)
	delete(r.started, uid)
	r.progressMu.Unlock()
}
