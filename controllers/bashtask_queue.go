package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// NewTaskPriority is the work queue priority of a task created while the
// controller runs: below the default 0 of every other event (an agent's
// report, a status write's watch event, a retry), so that a burst of
// creates waits behind the tasks already under way and cannot hold back
// their status (docs/performance.md, "A burst of creates"), and above
// controller-runtime's handler.LowPriority of the unchanged tasks a
// starting controller lists.
const NewTaskPriority = -10

// notNewTask passes every BashTask event to the For handler except the
// creation of a task while the controller runs, which newTasksLast
// queues.
func notNewTask() predicate.Predicate {
	return predicate.Funcs{CreateFunc: func(e event.CreateEvent) bool { return e.IsInInitialList }}
}

// newTasksLast queues a task created while the controller runs at
// NewTaskPriority; without a priority queue, as any event.
func newTasksLast() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.IsInInitialList || e.Object == nil {
				return
			}
			req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: e.Object.GetNamespace(), Name: e.Object.GetName()}}
			if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(NewTaskPriority)}, req)
				return
			}
			q.Add(req)
		},
	}
}
