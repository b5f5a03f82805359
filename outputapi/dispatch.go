package outputapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// dispatchPollInterval is how often waitDispatched reads the task when the
// server has no informer (Config.Informers nil): short, as a follower or a
// writer of input waits for the dispatch that long at most.
const dispatchPollInterval = 100 * time.Millisecond

// errServerStopped is why a wait after the server stopped polls.
var errServerStopped = errors.New("the output API server stopped")

// Informers hands out the shared informers of a controller-runtime cache;
// a manager's cache (mgr.GetCache()) is one.
type Informers interface {
	// GetInformer returns the informer of obj's kind, started and synced
	// when the cache runs.
	GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error)
}

// dispatched reports whether a request waiting for the task's dispatch
// can go on: the task has a node, or it has ended (it never will).
func dispatched(t *bashtaskv1alpha1.BashTask) bool {
	return finished(t) || (t.Status.NodeName != nil && *t.Status.NodeName != "")
}

// dispatchWaits wakes the requests waiting for their task's dispatch (and
// those waiting to ask its agent again, waitRetry) from one event handler
// on the BashTask informer, registered on the first wait and removed when
// the server stops: a dispatch reaches its waiters as soon as the cache
// sees it, and an idle wait costs no read.
type dispatchWaits struct {
	informers Informers

	mu      sync.Mutex
	inf     cache.Informer
	reg     toolscache.ResourceEventHandlerRegistration
	stopped bool
	waiters map[types.NamespacedName]map[*dispatchWaiter]struct{}
}

// dispatchWaiter is one waiting request: the handler leaves the task's
// latest state (or its deletion) here and signals wake.
type dispatchWaiter struct {
	wake chan struct{} // buffered 1: one pending wake-up is enough

	mu      sync.Mutex
	last    *bashtaskv1alpha1.BashTask
	deleted bool
}

// register adds the event handler once; an error leaves the next wait to
// try again.
func (d *dispatchWaits) register(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return errServerStopped
	}
	if d.reg != nil {
		return nil
	}
	inf, err := d.informers.GetInformer(ctx, &bashtaskv1alpha1.BashTask{})
	if err != nil {
		return fmt.Errorf("the BashTask informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { d.notify(obj, false) },
		UpdateFunc: func(_, obj any) { d.notify(obj, false) },
		DeleteFunc: func(obj any) { d.notify(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("adding the dispatch handler to the BashTask informer: %w", err)
	}
	d.inf, d.reg = inf, reg
	return nil
}

// stop removes the event handler; waits from then on poll.
func (d *dispatchWaits) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.reg != nil {
		_ = d.inf.RemoveEventHandler(d.reg)
		d.inf, d.reg = nil, nil
	}
}

// notify hands an event's task to the waiters of its name.
func (d *dispatchWaits) notify(obj any, deleted bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	t, ok := obj.(*bashtaskv1alpha1.BashTask)
	if !ok {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for w := range d.waiters[types.NamespacedName{Namespace: t.Namespace, Name: t.Name}] {
		w.mu.Lock()
		w.last, w.deleted = t, deleted
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func (d *dispatchWaits) add(key types.NamespacedName) *dispatchWaiter {
	w := &dispatchWaiter{wake: make(chan struct{}, 1)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.waiters == nil {
		d.waiters = map[types.NamespacedName]map[*dispatchWaiter]struct{}{}
	}
	if d.waiters[key] == nil {
		d.waiters[key] = map[*dispatchWaiter]struct{}{}
	}
	d.waiters[key][w] = struct{}{}
	return w
}

func (d *dispatchWaits) remove(key types.NamespacedName, w *dispatchWaiter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.waiters[key], w)
	if len(d.waiters[key]) == 0 {
		delete(d.waiters, key)
	}
}

// waitDispatched waits until the task has a node (it was dispatched) or
// has ended, and returns it as then read; errTaskGone once it is deleted
// or re-created under its name; the context's cause when ctx ends first.
// With Config.Informers it reacts to the informer's events on the task;
// without, it reads the task every dispatchPollInterval.
func (s *Server) waitDispatched(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	if s.cfg.Informers == nil || s.dispatch.register(ctx) != nil {
		return s.pollDispatched(ctx, task)
	}
	key := types.NamespacedName{Namespace: task.Namespace, Name: task.Name}
	w := s.dispatch.add(key)
	defer s.dispatch.remove(key, w)
	// Read once the waiter is in place: a dispatch before it is seen here,
	// one after it wakes the waiter.
	t, err := s.refetch(ctx, task)
	if err != nil {
		return nil, err
	}
	if dispatched(t) {
		return t, nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-w.wake:
		}
		w.mu.Lock()
		last, deleted := w.last, w.deleted
		w.mu.Unlock()
		if last == nil {
			continue
		}
		if last.UID != task.UID {
			if deleted {
				continue // an older task of the same name
			}
			return nil, errTaskGone
		}
		if deleted {
			return nil, errTaskGone
		}
		if dispatched(last) {
			return last.DeepCopy(), nil
		}
	}
}

// pollDispatched is waitDispatched without an informer.
func (s *Server) pollDispatched(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	tick := time.NewTicker(dispatchPollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-tick.C:
		}
		t, err := s.refetch(ctx, task)
		if err != nil {
			return nil, err
		}
		if dispatched(t) {
			return t, nil
		}
	}
}

// waitRetry waits before a request asks the task's agent again: d, or
// less when the informer shows a change of the task first (its end, its
// Running status), which the caller then reads. Without an informer it
// waits d. The context's cause when ctx ends first.
func (s *Server) waitRetry(ctx context.Context, task *bashtaskv1alpha1.BashTask, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	var wake <-chan struct{}
	if s.cfg.Informers != nil && s.dispatch.register(ctx) == nil {
		key := types.NamespacedName{Namespace: task.Namespace, Name: task.Name}
		w := s.dispatch.add(key)
		defer s.dispatch.remove(key, w)
		wake = w.wake
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
	case <-wake:
	}
	return nil
}
