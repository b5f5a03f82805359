package controllers_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// TestReleaseTasks is the uninstall hook: a running task ends Cancelled,
// every task loses the finalizer, and a task never dispatched stays
// Pending for a later install.
func TestReleaseTasks(t *testing.T) {
	ns := newNamespace(t)
	running := newTask(ns, "running", "sleep 300")
	finished := newTask(ns, "finished", "true")
	suspended := newTask(ns, "suspended", "true", func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(true) })
	for _, bt := range []*v1.BashTask{running, finished, suspended} {
		create(t, bt)
	}
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		g.Expect(get(g, running).Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
	}).WithTimeout(waitLong).Should(Succeed())
	waitTerminal(t, finished)
	for _, bt := range []*v1.BashTask{running, finished, suspended} {
		g.Expect(controllerutil.ContainsFinalizer(get(g, bt), controllers.Finalizer)).To(BeTrue(), "%s has no finalizer before the release", bt.Name)
	}

	err := controllers.ReleaseTasks(t.Context(), k8s, controllers.ReleaseOptions{Namespace: ns, Timeout: waitLong, Poll: 50 * time.Millisecond, Logf: t.Logf})
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(get(g, running).Status.Reason).To(HaveValue(Equal(v1.ReasonCancelled)))
	g.Expect(get(g, finished).Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	g.Expect(get(g, suspended).Status.Reason).To(BeNil(), "a task never dispatched stays pending")
	for _, bt := range []*v1.BashTask{running, finished, suspended} {
		g.Expect(controllerutil.ContainsFinalizer(get(g, bt), controllers.Finalizer)).To(BeFalse(), "%s keeps the finalizer", bt.Name)
	}
}
