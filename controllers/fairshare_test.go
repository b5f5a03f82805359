package controllers_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// dispatchOrder records, from a watch, the order in which the tasks of a
// namespace were dispatched (status.nodeName written) or started
// (status.startTime written), and when.
type dispatchOrder struct {
	mu    sync.Mutex
	names []string
	at    map[string]time.Time
	// starts records starts rather than dispatches.
	starts bool
}

func (d *dispatchOrder) record(bt *v1.BashTask) {
	d.mu.Lock()
	defer d.mu.Unlock()
	happened := ptr.Deref(bt.Status.NodeName, "") != ""
	if d.starts {
		happened = bt.Status.StartTime != nil
	}
	if !happened || !d.at[bt.Name].IsZero() {
		return
	}
	d.names = append(d.names, bt.Name)
	d.at[bt.Name] = time.Now()
}

// first returns the first of names dispatched, "" when none was.
func (d *dispatchOrder) first(names []string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.names {
		if slices.Contains(names, n) {
			return n
		}
	}
	return ""
}

func (d *dispatchOrder) dispatched(name string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.at[name]
	return at, ok
}

// watchDispatches starts recording the dispatches of ns's tasks.
func watchDispatches(t *testing.T, ns string) *dispatchOrder {
	t.Helper()
	return watchOrder(t, ns, false)
}

// watchStarts starts recording the starts of ns's tasks.
func watchStarts(t *testing.T, ns string) *dispatchOrder {
	t.Helper()
	return watchOrder(t, ns, true)
}

// watchOrder starts recording the dispatches, or the starts, of ns's
// tasks.
func watchOrder(t *testing.T, ns string, starts bool) *dispatchOrder {
	t.Helper()
	wc, err := client.NewWithWatch(rig.Env.Config, client.Options{Scheme: rig.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(t.Context(), &v1.BashTaskList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	d := &dispatchOrder{at: map[string]time.Time{}, starts: starts}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if bt, ok := ev.Object.(*v1.BashTask); ok && ev.Type != watch.Deleted {
				d.record(bt)
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return d
}

// TestFairTurns: a burst of tasks without an owner fills the two slots of
// node-e's agent and queues eight more; then a task of another owner
// arrives and waits. When one slot frees (a running task of the burst is
// cancelled), the newcomer starts next, before every task of the burst
// that was waiting when it arrived: its owner runs no task, the burst's
// runs two. Two rounds with two newcomers. The burst is created 60 ms
// apart, so that the waiting tasks' retries are spread over the 500 ms
// retry interval: without the turns, a freed slot goes to whichever
// waiting task retries first, the newcomer about once in nine, and both
// rounds pass by chance about once in seventy runs. Starts are what is
// compared, not dispatches: a task the controller dispatched while its
// count of the agent's tasks was behind (the agent refused its Start as
// full) is dispatched early, and must still wait its turn to start.
func TestFairTurns(t *testing.T) {
	ns := newNamespace(t)
	order := watchStarts(t, ns)
	g := NewWithT(t)
	onTurnsNode := func(bt *v1.BashTask) {
		bt.Spec.NodeName = ptr.To(turnsNode)
		bt.Spec.TimeoutSeconds = ptr.To[int32](300)
	}
	var burst []string
	for i := range 10 {
		bt := newTask(ns, fmt.Sprintf("burst-%02d", i), "sleep 300", onTurnsNode)
		create(t, bt)
		burst = append(burst, bt.Name)
		time.Sleep(60 * time.Millisecond)
	}
	t.Cleanup(func() {
		_ = k8s.DeleteAllOf(ctxBackground(), &v1.BashTask{}, client.InNamespace(ns))
	})
	waitStartedQueued(t, ns, burst, turnsCapacity)

	for _, owner := range []string{"fair-b", "fair-c"} {
		newcomer := newTask(ns, "newcomer-"+owner, "echo hi", onTurnsNode, func(bt *v1.BashTask) { bt.Spec.Owner = ptr.To(owner) })
		create(t, newcomer)
		g.Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(get(g, newcomer).Status.Conditions, v1.ConditionScheduled)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(BeEquivalentTo("False"))
		}).WithTimeout(waitLong).WithPolling(20 * time.Millisecond).Should(Succeed())
		var waiting, running []string
		for _, n := range burst {
			if _, ok := order.dispatched(n); ok {
				running = append(running, n)
			} else {
				waiting = append(waiting, n)
			}
		}
		freed := cancelOneRunning(t, ns, running)
		cancelled := time.Now()
		contenders := append([]string{newcomer.Name}, waiting...)
		g.Eventually(func() string { return order.first(contenders) }).WithTimeout(waitLong).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		g.Expect(order.first(contenders)).To(Equal(newcomer.Name),
			"after %s ended, a task of the burst that was waiting when %s arrived started first; start order %v", freed, newcomer.Name, order.names)
		at, _ := order.dispatched(newcomer.Name)
		t.Logf("%s started %s after %s was cancelled", newcomer.Name, at.Sub(cancelled).Round(time.Millisecond), freed)
		g.Expect(waitTerminal(t, newcomer).Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	}
}

// waitQueued waits until slots tasks of names are dispatched and every
// other one waits with Scheduled=False.
func waitQueued(t *testing.T, ns string, names []string, slots int) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		var list v1.BashTaskList
		g.Expect(k8s.List(ctxBackground(), &list, client.InNamespace(ns))).To(Succeed())
		dispatched, waiting := 0, 0
		for _, bt := range list.Items {
			c := meta.FindStatusCondition(bt.Status.Conditions, v1.ConditionScheduled)
			switch {
			case ptr.Deref(bt.Status.NodeName, "") != "":
				dispatched++
			case c != nil && c.Status == "False":
				waiting++
			}
		}
		g.Expect(dispatched).To(Equal(slots))
		g.Expect(waiting).To(Equal(len(names) - slots))
	}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
}

// waitStartedQueued waits until slots tasks of names are started and
// every other one waits: not started, with its Scheduled condition set
// (False while it waits to be placed, True for one dispatched whose Start
// its agent refused as full).
func waitStartedQueued(t *testing.T, ns string, names []string, slots int) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		var list v1.BashTaskList
		g.Expect(k8s.List(ctxBackground(), &list, client.InNamespace(ns))).To(Succeed())
		started, waiting := 0, 0
		for _, bt := range list.Items {
			switch {
			case bt.Status.StartTime != nil:
				started++
			case meta.FindStatusCondition(bt.Status.Conditions, v1.ConditionScheduled) != nil:
				waiting++
			}
		}
		g.Expect(started).To(Equal(slots))
		g.Expect(waiting).To(Equal(len(names) - slots))
	}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
}

// cancelOneRunning cancels the first of running that is still running
// and returns its name.
func cancelOneRunning(t *testing.T, ns string, running []string) string {
	t.Helper()
	for _, n := range running {
		bt := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: n}, bt); err != nil {
			t.Fatal(err)
		}
		if bt.Status.Reason != nil || ptr.Deref(bt.Spec.CancelRequested, false) {
			continue
		}
		patch := client.MergeFrom(bt.DeepCopy())
		bt.Spec.CancelRequested = ptr.To(true)
		if err := k8s.Patch(t.Context(), bt, patch); err != nil {
			t.Fatal(err)
		}
		return n
	}
	t.Fatalf("none of %v is running", running)
	return ""
}

// TestSlotsHeldUntilStart: eight tasks created at once for node-e's two
// slots, placed by four workers side by side. Each placement holds its
// slot until the agent's Start returns, so exactly two are dispatched and
// the other six wait undispatched; without the held slots, workers that
// place before the agent counts the first Start dispatch more than two,
// and the extra ones sit on the node retrying a Start the agent refuses.
func TestSlotsHeldUntilStart(t *testing.T) {
	ns := newNamespace(t)
	order := watchDispatches(t, ns)
	var names []string
	var wg sync.WaitGroup
	for i := range 8 {
		bt := newTask(ns, fmt.Sprintf("at-once-%d", i), "sleep 300", func(bt *v1.BashTask) {
			bt.Spec.NodeName = ptr.To(turnsNode)
			bt.Spec.TimeoutSeconds = ptr.To[int32](300)
		})
		names = append(names, bt.Name)
		wg.Go(func() { create(t, bt) })
	}
	wg.Wait()
	t.Cleanup(func() {
		_ = k8s.DeleteAllOf(ctxBackground(), &v1.BashTask{}, client.InNamespace(ns))
	})
	waitQueued(t, ns, names, turnsCapacity)
	time.Sleep(time.Second) // a second chance for an extra dispatch to show
	waitQueued(t, ns, names, turnsCapacity)
	order.mu.Lock()
	defer order.mu.Unlock()
	if len(order.names) != turnsCapacity {
		t.Errorf("dispatched %v, want exactly %d on an agent of %d slots", order.names, turnsCapacity, turnsCapacity)
	}
}
