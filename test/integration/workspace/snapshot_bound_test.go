package workspace_test

import (
	"time"

	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// A workspace's status pointed at another owner's snapshot (by whoever
// may write bashworkspaces/status) restores nothing: the resume ends the
// workspace Failed with SnapshotRefused, naming the object and the
// workspace, and no task of it ever reads the other owner's files.
func TestRestoreRefusesAnotherWorkspacesSnapshot(t *testing.T) {
	ns := newNamespace(t)
	a := newWorkspace(ns, "a", func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("owner-a") })
	b := newWorkspace(ns, "b", func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("owner-b") })
	create(t, a)
	create(t, b)
	waitPhase(t, a, v1.WorkspaceReady)
	waitPhase(t, b, v1.WorkspaceReady)
	write := newTask(ns, "write-a", "a", "echo secret-of-a > note", owner("owner-a"))
	create(t, write)
	g := NewWithT(t)
	g.Expect(testutil.WaitTerminal(t, k8s, ns, []string{write.Name}, waitLong)[write.Name].Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))

	setSuspend(t, a, true)
	snapA := waitSuspendedAndReleased(t, a).Status.Snapshot
	g.Expect(snapA).NotTo(BeNil())
	setSuspend(t, b, true)
	waitSuspendedAndReleased(t, b)

	g.Eventually(func(g Gomega) {
		cur := getWorkspace(g, b)
		cur.Status.Snapshot = snapA.DeepCopy()
		g.Expect(k8s.Status().Update(ctxBackground(), cur)).To(Succeed())
	}).WithTimeout(waitLong).Should(Succeed())
	setSuspend(t, b, false)

	failed := waitPhase(t, b, v1.WorkspaceFailed)
	g.Expect(ptr.Deref(failed.Status.Message, "")).To(And(ContainSubstring(*snapA.URL), ContainSubstring("is not one of workspace "+ns+"/b")))
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "b") }).WithTimeout(10 * time.Second).Should(ContainElement(v1.WorkspaceReasonSnapshotRefused))
	for _, typ := range []string{v1.ConditionReady, v1.ConditionStalled} {
		c := meta.FindStatusCondition(failed.Status.Conditions, typ)
		g.Expect(c).NotTo(BeNil(), typ)
		g.Expect(c.Reason).To(Equal(v1.WorkspaceReasonSnapshotRefused), "the %s condition names why", typ)
	}
	g.Expect(failed.Status.RestoredFrom).To(BeNil(), "nothing was restored")
}
