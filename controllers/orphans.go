package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// OrphanAgents is what the [OrphanCollector] needs from the node agents.
// AgentRegistry implements it.
type OrphanAgents interface {
	// HeldTasks returns the tasks the connected agents hold and have not
	// been asked to forget.
	HeldTasks() []agentpool.HeldTask
	// Latest returns the newest reported status of a task, if any.
	Latest(node, uid string) (*agentv1.TaskStatus, bool)
	// CancelTask stops a task; idempotent.
	CancelTask(ctx context.Context, node, uid string) (*agentv1.TaskStatus, error)
	// ForgetTask lets the agent drop a finished task once uploaded.
	ForgetTask(ctx context.Context, node, uid string) (bool, error)
}

// OrphanCollectorOptions configures an [OrphanCollector].
type OrphanCollectorOptions struct {
	// Cache reads BashTasks from the manager's cache: a task found there
	// with the same UID is alive, with no API request.
	Cache client.Reader
	// APIReader reads from the API server, uncached (mgr.GetAPIReader):
	// nothing is stopped on the word of a cache that may lag behind.
	APIReader client.Reader
	// Agents are the node agents.
	Agents OrphanAgents
	// Held receives the tasks each agent lists at the start of a Watch
	// stream, that is on every (re)connect; see AgentRegistryOptions.Held.
	Held <-chan agentpool.HeldTask
	// Interval is the time between two checks of every task the agents
	// hold; zero or less disables the periodic check.
	Interval time.Duration
	// Metrics count the tasks stopped; may be nil.
	Metrics *Metrics
	// Workspaces, when set, has every check of Interval also remove the
	// workspace copies agents hold that are not their workspace's current
	// one (docs/workspaces.md, "Epochs"); Recorder reports each on its
	// workspace. Both may be nil.
	Workspaces WorkspaceCopies
	Recorder   events.EventRecorder
	// Log is the collector's logger.
	Log logr.Logger
}

// OrphanCollector stops and forgets tasks an agent holds whose BashTask no
// longer exists with that UID: the object was removed without the
// controller's cancel (a finalizer stripped by hand, an etcd restore, the
// CRD deleted and created again), so nothing else would ever end them
// before their own timeout. It checks each task an agent lists when its
// Watch stream (re)connects, each deleted BashTask the cache reports, and
// every task the agents hold each Interval. It implements
// manager.Runnable and runs on the leader only.
type OrphanCollector struct {
	opts  OrphanCollectorOptions
	queue workqueue.TypedRateLimitingInterface[agentpool.HeldTask]

	mu      sync.Mutex
	stopped map[agentpool.HeldTask]bool // orphans already counted and logged
	sweep   chan struct{}
}

// orphanRecheck is how often a cancelled orphan is looked at until it has
// finished and can be forgotten.
const orphanRecheck = time.Second

// NewOrphanCollector returns a collector; add it to the manager with
// SetupWithManager.
func NewOrphanCollector(opts OrphanCollectorOptions) (*OrphanCollector, error) {
	if opts.Cache == nil || opts.APIReader == nil || opts.Agents == nil {
		return nil, errors.New("orphan collector: the cache, the API reader and the agents are required")
	}
	return &OrphanCollector{
		opts: opts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[agentpool.HeldTask](),
			workqueue.TypedRateLimitingQueueConfig[agentpool.HeldTask]{Name: "orphans"}),
		stopped: map[agentpool.HeldTask]bool{},
		sweep:   make(chan struct{}, 1),
	}, nil
}

// SetupWithManager runs the collector with the manager and checks every
// BashTask the cache sees deleted: one deleted with its finalizer stripped
// while it ran is stopped at once, not at the next periodic check.
func (c *OrphanCollector) SetupWithManager(mgr ctrl.Manager) error {
	inf, err := mgr.GetCache().GetInformer(context.Background(), &bashtaskv1alpha1.BashTask{})
	if err != nil {
		return fmt.Errorf("watching BashTasks for orphans: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: c.deleted}); err != nil {
		return fmt.Errorf("watching BashTasks for orphans: %w", err)
	}
	return mgr.Add(c)
}

// Sweep asks for a check of every task the agents hold, now. Calls
// coalesce.
func (c *OrphanCollector) Sweep() {
	select {
	case c.sweep <- struct{}{}:
	default:
	}
}

func (c *OrphanCollector) deleted(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	bt, ok := obj.(*bashtaskv1alpha1.BashTask)
	if !ok {
		return
	}
	if node := ptr.Deref(bt.Status.NodeName, ""); node != "" {
		// A task deleted the normal way was forgotten before its finalizer
		// went: the check finds the agent no longer holds it and stops.
		c.queue.Add(agentpool.HeldTask{Node: node, Task: client.ObjectKeyFromObject(bt), UID: bt.UID})
	}
}

// Start runs the checks until ctx ends.
func (c *OrphanCollector) Start(ctx context.Context) error {
	defer c.queue.ShutDown()
	go func() {
		for c.work(ctx) {
		}
	}()
	var tick <-chan time.Time
	if c.opts.Interval > 0 {
		t := time.NewTicker(c.opts.Interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case h := <-c.opts.Held:
			c.queue.Add(h)
		case <-tick:
			c.enqueueAll(ctx)
			c.sweepWorkspaces(ctx)
		case <-c.sweep:
			c.enqueueAll(ctx)
			c.sweepWorkspaces(ctx)
		}
	}
}

// enqueueAll queues every held task the cache does not know with its UID.
// One list of the cache, without copies, spares a check per live task.
func (c *OrphanCollector) enqueueAll(ctx context.Context) {
	held := c.opts.Agents.HeldTasks()
	if len(held) == 0 {
		return
	}
	var list bashtaskv1alpha1.BashTaskList
	if err := c.opts.Cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		c.opts.Log.Error(err, "Listing BashTasks for the orphan check")
		return
	}
	live := make(map[types.UID]bool, len(list.Items))
	for i := range list.Items {
		live[list.Items[i].UID] = true
	}
	for _, h := range held {
		if !live[h.UID] {
			c.queue.Add(h)
		}
	}
}

func (c *OrphanCollector) work(ctx context.Context) bool {
	h, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(h)
	again, err := c.check(ctx, h)
	switch {
	case err != nil:
		c.opts.Log.Error(err, "Checking a task an agent holds", "node", h.Node, "namespace", h.Task.Namespace, "name", h.Task.Name, "uid", h.UID)
		c.queue.AddRateLimited(h)
	case again > 0:
		c.queue.Forget(h)
		c.queue.AddAfter(h, again)
	default:
		c.queue.Forget(h)
	}
	return true
}

// check stops and forgets h when its BashTask no longer exists with its
// UID. It returns a delay when the task must be looked at again (it was
// cancelled and has not finished yet).
func (c *OrphanCollector) check(ctx context.Context, h agentpool.HeldTask) (time.Duration, error) {
	uid := string(h.UID)
	ts, held := c.opts.Agents.Latest(h.Node, uid)
	if !held || ts.GetForgetRequested() {
		// Gone, or leaving once its uploads are done: nothing to do. An
		// agent that is not connected is checked again when it reconnects.
		c.done(h)
		return 0, nil
	}
	if alive, err := c.exists(ctx, h); err != nil || alive {
		c.done(h)
		return 0, err
	}
	c.mu.Lock()
	first := !c.stopped[h]
	c.stopped[h] = true
	c.mu.Unlock()
	if first {
		c.opts.Log.Info("Stopping and forgetting a task whose BashTask no longer exists", "node", h.Node,
			"namespace", h.Task.Namespace, "name", h.Task.Name, "uid", uid, "state", ts.GetState().String())
		if c.opts.Metrics != nil {
			c.opts.Metrics.OrphansStopped.Inc()
		}
	}
	if ts.GetState() != agentv1.TaskState_TASK_STATE_FINISHED {
		if _, err := c.opts.Agents.CancelTask(ctx, h.Node, uid); err != nil && !errors.Is(err, agentpool.ErrTaskUnknown) {
			return 0, err
		}
		// Forget is refused until the task has finished; its terminal
		// event arrives after the kill grace.
		return orphanRecheck, nil
	}
	if _, err := c.opts.Agents.ForgetTask(ctx, h.Node, uid); err != nil {
		return 0, err
	}
	c.done(h)
	return 0, nil
}

// exists reports whether h's BashTask exists with h's UID: first in the
// cache, and when the cache says no, in the API server, so a cache that
// has not seen a new task yet never gets it stopped.
func (c *OrphanCollector) exists(ctx context.Context, h agentpool.HeldTask) (bool, error) {
	if h.Task.Name == "" || h.Task.Namespace == "" {
		return false, nil // no object can have it
	}
	bt := &bashtaskv1alpha1.BashTask{}
	err := c.opts.Cache.Get(ctx, h.Task, bt)
	if err == nil && bt.UID == h.UID {
		return true, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("reading BashTask %s from the cache: %w", h.Task, err)
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(bashtaskv1alpha1.GroupVersion.WithKind("BashTask"))
	err = c.opts.APIReader.Get(ctx, h.Task, m)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading BashTask %s from the API server: %w", h.Task, err)
	}
	return m.UID == h.UID, nil
}

func (c *OrphanCollector) done(h agentpool.HeldTask) {
	c.mu.Lock()
	delete(c.stopped, h)
	c.mu.Unlock()
}
