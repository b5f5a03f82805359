package controllers

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// TestNewTasksQueueLast: in controller-runtime's priority queue, the
// report of a running task (an agent event, queued as any event) is
// served before a burst of 1,000 tasks created before it, which
// newTasksLast queues at NewTaskPriority; a task listed at the start
// stays behind both. Without newTasksLast (the For handler's create,
// at the default priority) the burst would come first.
func TestNewTasksQueueLast(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("new-tasks-last-test")
	defer q.ShutDown()
	ctx := t.Context()
	task := func(name string) *bashtaskv1alpha1.BashTask {
		return &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	}
	// A task the starting controller lists: For's handler.
	handler.WithLowPriorityWhenUnchanged(&handler.EnqueueRequestForObject{}).Create(ctx, event.CreateEvent{Object: task("listed"), IsInInitialList: true}, q)
	for i := range 1000 {
		newTasksLast().Create(ctx, event.CreateEvent{Object: task(fmt.Sprintf("burst-%04d", i))}, q)
	}
	// An agent's report: the channel source's handler, a generic event.
	(&handler.TypedEnqueueRequestForObject[*bashtaskv1alpha1.BashTask]{}).Generic(ctx, event.TypedGenericEvent[*bashtaskv1alpha1.BashTask]{Object: task("running")}, q)

	first, prio, _ := q.GetWithPriority()
	if want := (reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "running"}}); first != want {
		t.Fatalf("first served %v (priority %d), want the running task's report ahead of the burst", first, prio)
	}
	q.Done(first)
	for i := range 1000 {
		got, prio, _ := q.GetWithPriority()
		if prio != NewTaskPriority || got.Name == "listed" {
			t.Fatalf("item %d of the burst: %v at priority %d, want a new task at %d", i, got, prio, NewTaskPriority)
		}
		q.Done(got)
	}
	if last, prio, _ := q.GetWithPriority(); last.Name != "listed" || prio != handler.LowPriority {
		t.Fatalf("last served %v at priority %d, want the listed task at %d", last, prio, handler.LowPriority)
	}
}
