package controllers_test

import (
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// A task asking for a memory limit its node does not enforce says so in
// every status from its dispatch on (the write-ahead), never
// limitsEnforced true, with the LimitsEnforced=False condition naming the
// limit and one Warning event. The rig's agents run on this host's cgroup
// v2, which on hosts of the hybrid layout has no memory controller.
func TestLimitsNotEnforcedFromDispatch(t *testing.T) {
	t.Parallel()
	for _, node := range []string{"node-a", "node-b"} {
		if slices.Contains(rig.Registry.Agent(node).EnforcedLimits, "memory") {
			t.Skipf("the agent on %s enforces memory (%v): the test needs a node that does not", node, rig.Registry.Agent(node).EnforcedLimits)
		}
	}
	ns := newNamespace(t)
	wc, err := client.NewWithWatch(rig.Env.Config, client.Options{Scheme: rig.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	bt := newTask(ns, "mem", "sleep 1.5", func(bt *v1.BashTask) {
		bt.Spec.NodeSelector = map[string]string{"zone": "a"}
		bt.Spec.Resources = &v1.ResourceLimits{Memory: ptr.To(resource.MustParse("256Mi"))}
	})
	create(t, bt)
	w, err := wc.Watch(t.Context(), &v1.BashTaskList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: bt.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var seen []v1.BashTaskStatus
	for deadline := time.After(waitLong); len(seen) == 0 || seen[len(seen)-1].Reason == nil; {
		select {
		case ev := <-w.ResultChan():
			if got, ok := ev.Object.(*v1.BashTask); ok && got.ResourceVersion != bt.ResourceVersion {
				seen = append(seen, got.Status)
			}
		case <-deadline:
			t.Fatalf("no terminal status within %v; saw %d", waitLong, len(seen))
		}
	}
	running := false
	for i, st := range seen {
		if ptr.Deref(st.NodeName, "") == "" {
			continue
		}
		running = running || ptr.Deref(st.Phase, "") == v1.PhaseRunning
		iso := ptr.Deref(st.Isolation, v1.IsolationStatus{})
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionLimitsEnforced)
		if !slices.Equal(iso.LimitsNotEnforced, []v1.ResourceLimitName{v1.LimitMemory}) || ptr.Deref(iso.LimitsEnforced, true) ||
			c == nil || c.Status != metav1.ConditionFalse || c.Reason != controllers.ReasonLimitsNotEnforced {
			t.Errorf("status %d (phase %s): limitsNotEnforced %v, limitsEnforced %v, condition %+v; want [memory], false, LimitsEnforced=False/NotEnforced",
				i, ptr.Deref(st.Phase, ""), iso.LimitsNotEnforced, iso.LimitsEnforced, c)
		}
	}
	if !running {
		t.Errorf("no status showed the task Running: %d statuses", len(seen))
	}
	g := NewWithT(t)
	g.Eventually(func(g Gomega) []string {
		var list eventsv1.EventList
		g.Expect(k8s.List(ctxBackground(), &list, client.InNamespace(ns))).To(Succeed())
		var got []string
		for _, ev := range list.Items {
			if ev.Reason == controllers.ReasonLimitsNotEnforced {
				got = append(got, ev.Type+" "+ev.Note)
			}
		}
		return got
	}).WithTimeout(waitLong).Should(ConsistOf(HavePrefix("Warning node node-a does not enforce spec.resources.memory")))
}
