package controllers_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// startupTasks is the number of finished tasks TestStartWritesNoFinishedTask
// keeps across the controller's restart.
const startupTasks = 100

// TestStartWritesNoFinishedTask: a controller that starts (a new leader)
// reconciles every finished task it lists and writes none of them: no
// status, finalizer, label or annotation. Every task's resourceVersion is
// the same after the new controller's passes as before its start.
func TestStartWritesNoFinishedTask(t *testing.T) {
	ns := newNamespace(t)
	tasks := make([]*v1.BashTask, startupTasks)
	for i := range tasks {
		tasks[i] = newTask(ns, fmt.Sprintf("done-%03d", i), "echo done")
		create(t, tasks[i])
	}
	for _, bt := range tasks {
		waitSettled(t, bt)
	}
	before := versions(t, ns)

	var all v1.BashTaskList
	if err := k8s.List(t.Context(), &all); err != nil {
		t.Fatal(err)
	}
	passes := reconcileTotal(t)
	if err := rig.RestartController(); err != nil {
		t.Fatalf("restarting the controller: %v", err)
	}
	// The new controller lists every task of the cluster and passes over
	// each at least once.
	deadline := time.Now().Add(time.Minute)
	for reconcileTotal(t) < passes+float64(len(all.Items)) {
		if time.Now().After(deadline) {
			t.Fatalf("the new controller made %.0f passes in a minute, want at least %d", reconcileTotal(t)-passes, len(all.Items))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // a write of the last passes shows
	after := versions(t, ns)
	if !maps.Equal(before, after) {
		for name, rv := range after {
			if before[name] != rv {
				t.Errorf("%s was written at the controller's start: resourceVersion %s, was %s", name, rv, before[name])
			}
		}
	}
}

// waitSettled waits until a task is terminal with no upload pending, so
// that nothing is left to write to it.
func waitSettled(t *testing.T, bt *v1.BashTask) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		got := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), got); err == nil && got.Status.Reason != nil &&
			!meta.IsStatusConditionFalse(got.Status.Conditions, v1.ConditionOutputUploaded) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not settle in %s", bt.Name, waitLong)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// versions returns each task of ns's resourceVersion.
func versions(t *testing.T, ns string) map[string]string {
	t.Helper()
	var list v1.BashTaskList
	if err := k8s.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, bt := range list.Items {
		out[bt.Name] = bt.ResourceVersion
	}
	return out
}

// reconcileTotal is controller-runtime's count of the BashTask
// controller's passes in this process, over every result.
func reconcileTotal(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "bashtask" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
