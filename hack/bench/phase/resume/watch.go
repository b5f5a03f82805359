package resume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// seen is one watch event: when the client received it and the object.
type seen[T client.Object] struct {
	at  time.Time
	obj T
}

// events records every Added and Modified event of one kind in the
// bench's namespace, in arrival order, so that a step can ask for the
// first event after its action that satisfies a condition, with the time
// it arrived.
type events[T client.Object] struct {
	kind string

	mu      sync.Mutex
	list    []seen[T]
	changed chan struct{} // closed and replaced at each append
	err     error         // why the watch ended for good
}

func newEvents[T client.Object](kind string) *events[T] {
	return &events[T]{kind: kind, changed: make(chan struct{})}
}

// mark is the position after the events recorded so far: a wait from it
// sees only events that arrive afterwards.
func (e *events[T]) mark() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.list)
}

// latest is the position of the last event of name recorded so far, so
// that a wait from it starts with the object's state as last seen, and
// that object; without one, mark() and false.
func (e *events[T]) latest(name string) (int, T, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.list) - 1; i >= 0; i-- {
		if e.list[i].obj.GetName() == name {
			return i, e.list[i].obj, true
		}
	}
	var none T
	return len(e.list), none, false
}

func (e *events[T]) add(at time.Time, obj T) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, seen[T]{at: at, obj: obj})
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *events[T]) fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.err = err
	close(e.changed)
	e.changed = make(chan struct{})
}

// errStop ends a wait early: the condition will not hold (the object
// failed).
var errStop = errors.New("stop waiting")

// wait returns the first event at or after position from for which cond
// returns true, and the position after it. cond returning errStop ends
// the wait with its message; a timeout names what was awaited and the
// last object of name that was seen, as describe puts it.
func (e *events[T]) wait(ctx context.Context, from int, timeout time.Duration, what, name string,
	cond func(T) (bool, error), describe func(T) string) (seen[T], int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var last T
	var haveLast bool
	for {
		e.mu.Lock()
		list, changed, werr := e.list, e.changed, e.err
		e.mu.Unlock()
		for ; from < len(list); from++ {
			ev := list[from]
			if ev.obj.GetName() != name {
				continue
			}
			last, haveLast = ev.obj, true
			ok, err := cond(ev.obj)
			if err != nil {
				return ev, from + 1, fmt.Errorf("%s %s: %w", e.kind, name, err)
			}
			if ok {
				return ev, from + 1, nil
			}
		}
		if werr != nil {
			return seen[T]{}, from, fmt.Errorf("waiting until %s: the watch on %ss ended: %w", what, e.kind, werr)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return seen[T]{}, from, ctx.Err()
		case <-deadline.C:
			state := "no event of it seen since the step began"
			if haveLast {
				state = "last seen: " + describe(last)
			}
			return seen[T]{}, from, fmt.Errorf("%s %s: not %s after %s (%s)", e.kind, name, what, timeout, state)
		}
	}
}

// follow runs a watch of newList's kind in namespace ns into e until ctx
// ends, starting again from the last resourceVersion when the API server
// closes it, and from the current state when that version is gone.
func follow[T client.Object](ctx context.Context, c client.WithWatch, ns string, newList func() client.ObjectList, e *events[T]) {
	rv := ""
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, newList(), client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			e.fail(fmt.Errorf("starting the watch: %w", err))
			return
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified:
				if obj, ok := ev.Object.(T); ok {
					rv = obj.GetResourceVersion()
					e.add(time.Now(), obj)
				}
			case watch.Error:
				if apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) || apierrors.IsGone(apierrors.FromObject(ev.Object)) {
					rv = ""
				}
			}
		}
		w.Stop()
	}
}
