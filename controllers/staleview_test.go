package controllers_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// statusHistory is every status a watch showed of one task, in order.
type statusHistory struct {
	name     string
	statuses []v1.BashTaskStatus
}

// backwards lists the ways h's statuses went backwards: Running to
// Pending, a terminal phase to another, a lower observedGeneration, and a
// change of a terminal field (reason, message, exitCode, signal, startTime,
// completionTime) once the task was terminal, or of startTime once set.
func (h *statusHistory) backwards() []string {
	var out []string
	for i := 1; i < len(h.statuses); i++ {
		a, b := &h.statuses[i-1], &h.statuses[i]
		at := fmt.Sprintf("%s, write %d", h.name, i)
		pa, pb := ptr.Deref(a.Phase, ""), ptr.Deref(b.Phase, "")
		switch {
		case pa == v1.PhaseRunning && (pb == v1.PhasePending || pb == ""):
			out = append(out, fmt.Sprintf("%s: phase Running -> %q", at, pb))
		case (pa == v1.PhaseSucceeded || pa == v1.PhaseFailed) && pb != pa:
			out = append(out, fmt.Sprintf("%s: phase %s -> %q", at, pa, pb))
		}
		if ga, gb := ptr.Deref(a.ObservedGeneration, 0), ptr.Deref(b.ObservedGeneration, 0); gb < ga {
			out = append(out, fmt.Sprintf("%s: observedGeneration %d -> %d", at, ga, gb))
		}
		if a.StartTime != nil && !a.StartTime.Equal(b.StartTime) {
			out = append(out, fmt.Sprintf("%s: startTime %v -> %v", at, a.StartTime, b.StartTime))
		}
		if a.Reason == nil {
			continue
		}
		for _, f := range []struct {
			name      string
			was, is   any
			unchanged bool
		}{
			{"reason", ptr.Deref(a.Reason, ""), ptr.Deref(b.Reason, ""), ptr.Equal(a.Reason, b.Reason)},
			{"message", ptr.Deref(a.Message, ""), ptr.Deref(b.Message, ""), ptr.Equal(a.Message, b.Message)},
			{"exitCode", a.ExitCode, b.ExitCode, ptr.Equal(a.ExitCode, b.ExitCode)},
			{"signal", ptr.Deref(a.Signal, ""), ptr.Deref(b.Signal, ""), ptr.Equal(a.Signal, b.Signal)},
			{"completionTime", a.CompletionTime, b.CompletionTime, a.CompletionTime.Equal(b.CompletionTime)},
		} {
			if !f.unchanged {
				out = append(out, fmt.Sprintf("%s: terminal field %s %v -> %v", at, f.name, f.was, f.is))
			}
		}
	}
	return out
}

// TestStatusNeverGoesBackwards pokes running tasks with label and
// annotation edits (each a new resourceVersion, racing every status write)
// and restarts the controller while they run, then checks, from a watch
// opened before the first task was created, that no task's status ever
// went backwards and that each ended with the outcome its command gives.
// Not parallel: the restart would disturb other tests' timing.
func TestStatusNeverGoesBackwards(t *testing.T) {
	ns := newNamespace(t)
	wc, err := client.NewWithWatch(rig.Env.Config, client.Options{Scheme: rig.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(t.Context(), &v1.BashTaskList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	var (
		mu      sync.Mutex
		history = map[types.UID]*statusHistory{}
	)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ev := range w.ResultChan() {
			bt, ok := ev.Object.(*v1.BashTask)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			mu.Lock()
			h := history[bt.UID]
			if h == nil {
				h = &statusHistory{name: bt.Name}
				history[bt.UID] = h
			}
			h.statuses = append(h.statuses, *bt.Status.DeepCopy())
			mu.Unlock()
		}
	}()

	type want struct {
		reason v1.Reason
		exit   int32
	}
	wants := map[string]want{}
	var tasks []*v1.BashTask
	for i := range 12 {
		name := fmt.Sprintf("poked-%02d", i)
		var command string
		var wnt want
		switch i % 3 {
		case 0: // outlives the restart
			command, wnt = fmt.Sprintf("for i in $(seq 8); do echo line $i; sleep 0.%d; done", 4+i%5), want{v1.ReasonSucceeded, 0}
		case 1: // ends around the restart
			command, wnt = fmt.Sprintf("echo start; sleep 1.%d; exit 3", i), want{v1.ReasonNonZeroExit, 3}
		default: // ends before it
			command, wnt = "echo quick", want{v1.ReasonSucceeded, 0}
		}
		node := []string{"node-a", "node-b"}[i%2]
		bt := newTask(ns, name, command, func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To(node) })
		create(t, bt)
		tasks = append(tasks, bt)
		wants[name] = wnt
	}

	// Metadata edits change the resourceVersion under every pass.
	stopPoking := make(chan struct{})
	poked := make(chan int)
	var pokes atomic.Int64 // edits so far, for the wait below
	go func() {
		n := 0
		defer func() { poked <- n }()
		for {
			for _, bt := range tasks {
				select {
				case <-stopPoking:
					return
				default:
				}
				patch := fmt.Appendf(nil, `{"metadata":{"labels":{"poke":"%d"},"annotations":{"example.com/poke":"%d"}}}`, n, n)
				if err := k8s.Patch(ctxBackground(), bt.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err == nil {
					n++
					pokes.Add(1)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	time.Sleep(1500 * time.Millisecond)
	if err := rig.RestartController(); err != nil {
		t.Fatalf("restarting the controller: %v", err)
	}
	for _, bt := range tasks {
		got := waitTerminal(t, bt)
		wnt := wants[bt.Name]
		if ptr.Deref(got.Status.Reason, "") != wnt.reason || ptr.Deref(got.Status.ExitCode, -1) != wnt.exit {
			t.Errorf("%s ended %v exit %v, want %s exit %d", bt.Name, ptr.Deref(got.Status.Reason, ""), ptr.Deref(got.Status.ExitCode, -1), wnt.reason, wnt.exit)
		}
	}
	// Keep poking finished tasks for a moment: a pass on a finished task
	// must not rewrite it either.
	// How many edits fit in that time depends on the machine's load, so
	// it goes on until there were enough to make the race the test is
	// about (checked below), up to a minute.
	time.Sleep(time.Second)
	for deadline := time.Now().Add(time.Minute); pokes.Load() < int64(len(tasks)*5) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	close(stopPoking)
	edits := <-poked
	time.Sleep(500 * time.Millisecond) // the last events reach the watch
	w.Stop()
	<-watchDone

	mu.Lock()
	defer mu.Unlock()
	if len(history) != len(tasks) {
		t.Fatalf("the watch saw %d tasks, want %d", len(history), len(tasks))
	}
	for _, h := range history {
		for _, p := range h.backwards() {
			t.Error(p)
		}
	}
	t.Logf("%d metadata edits raced the controller's status writes", edits)
	if edits < len(tasks)*5 {
		t.Errorf("only %d metadata edits were made; the test did not race the controller", edits)
	}
	if v := rig.Metrics.StatusRegressions.WithLabelValues("refused"); testutil.ToFloat64(v) != 0 {
		t.Errorf("the restarted controller refused %v status writes that would have gone backwards", testutil.ToFloat64(v))
	}
}

// TestStatusHistoryBackwards checks that the test's detector finds each way
// a status can go backwards, so that TestStatusNeverGoesBackwards can fail.
func TestStatusHistoryBackwards(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0))
	t1 := metav1.NewTime(time.Unix(1001, 0))
	running := v1.BashTaskStatus{Phase: ptr.To(v1.PhaseRunning), StartTime: &t0, ObservedGeneration: ptr.To[int64](2)}
	done := v1.BashTaskStatus{Phase: ptr.To(v1.PhaseFailed), Reason: ptr.To(v1.ReasonNonZeroExit), ExitCode: ptr.To[int32](3),
		StartTime: &t0, CompletionTime: &t1, ObservedGeneration: ptr.To[int64](2)}
	tests := map[string]struct {
		next v1.BashTaskStatus
		want int
	}{
		"same":                 {done, 0},
		"running to pending":   {v1.BashTaskStatus{Phase: ptr.To(v1.PhasePending), StartTime: &t0, ObservedGeneration: ptr.To[int64](2)}, 1},
		"generation decreases": {func() v1.BashTaskStatus { s := *running.DeepCopy(); s.ObservedGeneration = ptr.To[int64](1); return s }(), 1},
		"start time changes":   {func() v1.BashTaskStatus { s := *running.DeepCopy(); s.StartTime = &t1; return s }(), 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := &statusHistory{name: "x", statuses: []v1.BashTaskStatus{running, tc.next}}
			if got := h.backwards(); len(got) != tc.want {
				t.Errorf("found %q, want %d problems", got, tc.want)
			}
		})
	}
	terminal := map[string]func(*v1.BashTaskStatus){
		"reason":         func(s *v1.BashTaskStatus) { s.Reason = ptr.To(v1.ReasonAgentLost) },
		"exit code":      func(s *v1.BashTaskStatus) { s.ExitCode = ptr.To[int32](0) },
		"completionTime": func(s *v1.BashTaskStatus) { s.CompletionTime = &t0 },
		"phase":          func(s *v1.BashTaskStatus) { s.Phase = ptr.To(v1.PhaseRunning) },
	}
	for name, mutate := range terminal {
		t.Run("terminal "+name, func(t *testing.T) {
			next := done.DeepCopy()
			mutate(next)
			h := &statusHistory{name: "x", statuses: []v1.BashTaskStatus{done, *next}}
			if got := h.backwards(); len(got) == 0 {
				t.Errorf("a change of %s after the end was not found", name)
			}
		})
	}
}
