package controllers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// burstSize is the number of tasks TestBurstOfCreatesKeepsStatus creates
// at once; creates in flight at a time while it does.
const (
	burstSize    = 400
	burstWorkers = 16
)

// TestBurstOfCreatesKeepsStatus: a burst of creates does not hold back
// the status of a task already running. Its end is reported while
// hundreds of new tasks wait for their dispatch, and its terminal status
// must be written while most of them still wait. The order comes from one
// watch of the namespace (the order of the writes), not from the clock.
// The order of the work queue itself (NewTaskPriority) is pinned by
// TestNewTasksQueueLast: here the agents' task slots, not the queue, may
// be what the burst waits for.
func TestBurstOfCreatesKeepsStatus(t *testing.T) {
	ns := newNamespace(t)
	gate := filepath.Join(t.TempDir(), "go")
	long := newTask(ns, "long", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.02; done", gate))
	create(t, long)
	waitRunning(t, long)

	wc, err := client.NewWithWatch(rig.Env.Config, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(t.Context(), &v1.BashTaskList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	createBurst(t, ns)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before, after := dispatchesAround(t, w, "long")
	t.Logf("burst of %d: %d dispatched before the running task's terminal status, %d after", burstSize, before, after)
	// In order of arrival, only the creates the workers hold at the report
	// (4) and the tasks a freed slot lets go could follow it.
	if after < burstSize/4 {
		t.Errorf("only %d of %d new tasks were dispatched after the running task's terminal status: the burst held it back", after, burstSize)
	}
}

// waitRunning waits until the task's phase is Running.
func waitRunning(t *testing.T, bt *v1.BashTask) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		got := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), got); err == nil && ptr.Deref(got.Status.Phase, "") == v1.PhaseRunning {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not Running after %s", bt.Name, waitLong)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createBurst creates burstSize tasks in ns, burstWorkers at a time.
func createBurst(t *testing.T, ns string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, burstSize)
	names := make(chan int)
	for range burstWorkers {
		wg.Go(func() {
			for i := range names {
				if err := k8s.Create(t.Context(), newTask(ns, fmt.Sprintf("burst-%03d", i), "true")); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range burstSize {
		names <- i
	}
	close(names)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("creating the burst: %v", err)
	}
}

// dispatchesAround reads w until the task name's terminal status and every
// task of the burst dispatched, and counts the burst's first dispatch
// writes (status.nodeName set) before and after that terminal status.
func dispatchesAround(t *testing.T, w watch.Interface, name string) (before, after int) {
	t.Helper()
	dispatched := map[string]bool{}
	ended := false
	timeout := time.After(2 * time.Minute)
	for !ended || len(dispatched) < burstSize {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-timeout:
			t.Fatalf("after 2m: terminal status seen %v, %d of %d dispatched", ended, len(dispatched), burstSize)
		}
		bt, ok := ev.Object.(*v1.BashTask)
		if !ok {
			continue
		}
		switch {
		case bt.Name == name:
			ended = ended || bt.Status.Reason != nil
		case ptr.Deref(bt.Status.NodeName, "") != "" && !dispatched[bt.Name]:
			dispatched[bt.Name] = true
			if ended {
				after++
			} else {
				before++
			}
		}
	}
	return before, after
}
