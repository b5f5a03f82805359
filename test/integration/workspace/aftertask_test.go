package workspace_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// spec.snapshot.afterTaskSeconds snapshots a workspace that a task
// changed that long after the task ended, without suspending it, and not
// again while no task changes it; 0 turns it off.
func TestSnapshotAfterTask(t *testing.T) {
	ns := newNamespace(t)
	after := func(s int32) func(*v1.BashWorkspace) {
		return func(ws *v1.BashWorkspace) {
			ws.Spec.Snapshot = &v1.WorkspaceSnapshotPolicy{AfterTaskSeconds: ptr.To(s)}
		}
	}
	ws, off := newWorkspace(ns, "after", after(2)), newWorkspace(ns, "off", after(0))
	create(t, ws)
	create(t, off)
	waitPhase(t, ws, v1.WorkspaceReady)
	waitPhase(t, off, v1.WorkspaceReady)
	g := NewWithT(t)
	one, offOne := newTask(ns, "one", "after", "echo one > f"), newTask(ns, "off-one", "off", "echo one > f")
	create(t, one)
	create(t, offOne)
	testutil.WaitTerminal(t, k8s, ns, []string{one.Name, offOne.Name}, waitLong)

	var first *v1.BashWorkspace
	g.Eventually(func(g Gomega) {
		first = getWorkspace(g, ws)
		g.Expect(first.Status.Snapshot).NotTo(BeNil())
		g.Expect(first.Status.LastTaskTime).NotTo(BeNil())
	}).WithTimeout(waitLong).WithPolling(100*time.Millisecond).Should(Succeed(), "a snapshot after the task")
	gap := first.Status.Snapshot.Time.Sub(first.Status.LastTaskTime.Time)
	g.Expect(gap).To(BeNumerically(">=", time.Second), "not before afterTaskSeconds (2 s, in whole seconds)")
	g.Expect(gap).To(BeNumerically("<=", 5*time.Second), "soon after afterTaskSeconds")
	g.Expect(first.Status.Phase).To(HaveValue(Equal(v1.WorkspaceReady)), "snapshotted, not suspended")

	g.Consistently(func(g Gomega) {
		g.Expect(getWorkspace(g, ws).Status.Snapshot.URL).To(Equal(first.Status.Snapshot.URL))
		g.Expect(getWorkspace(g, off).Status.Snapshot).To(BeNil())
	}).WithTimeout(5*time.Second).WithPolling(250*time.Millisecond).Should(Succeed(), "no snapshot of an unchanged workspace, none with 0")

	two := newTask(ns, "two", "after", "echo two > f")
	create(t, two)
	testutil.WaitTerminal(t, k8s, ns, []string{two.Name}, waitLong)
	g.Eventually(func(g Gomega) {
		g.Expect(getWorkspace(g, ws).Status.Snapshot.URL).NotTo(Equal(first.Status.Snapshot.URL))
	}).WithTimeout(waitLong).WithPolling(100*time.Millisecond).Should(Succeed(), "a snapshot after the next task that changed it")
}

// restoreNotice checks that of tasks exactly one carries the restore
// notice (status.workspaceRestore and the WorkspaceRestored condition),
// from the snapshot url, with lostNode, and returns it.
func restoreNotice(g Gomega, tasks map[string]*v1.BashTask, url *string, lostNode string) *v1.BashTask {
	var with []*v1.BashTask
	for _, bt := range tasks {
		if bt.Status.WorkspaceRestore != nil {
			with = append(with, bt)
		}
	}
	g.Expect(with).To(HaveLen(1), "exactly one task carries the notice")
	n := with[0].Status.WorkspaceRestore
	g.Expect(n.URL).To(Equal(url))
	g.Expect(n.SnapshotTime).NotTo(BeNil())
	g.Expect(n.AgeSeconds).NotTo(BeNil())
	g.Expect(ptr.Deref(n.LostNode, "")).To(Equal(lostNode))
	if lostNode != "" {
		g.Expect(n.LostTime).NotTo(BeNil())
	}
	c := meta.FindStatusCondition(with[0].Status.Conditions, v1.ConditionWorkspaceRestored)
	g.Expect(c).NotTo(BeNil())
	g.Expect(c.Message).To(ContainSubstring("restored on node"))
	return with[0]
}
