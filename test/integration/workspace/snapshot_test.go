package workspace_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// spec.suspend snapshots a workspace and releases its node's copy; a
// task for it meanwhile is refused at once (WorkspaceUnavailable) with
// how to resume it; set back to false, the workspace is restored on a
// node at a new epoch with its files and carried directory, the status
// says from which snapshot, and a task created with the resume waits for
// the restore and runs.
func TestSuspendAndResume(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "s", func(ws *v1.BashWorkspace) {
		ws.Spec.CarryOver = &v1.CarryOver{Environment: ptr.To(true)}
	})
	create(t, ws)
	ready := waitPhase(t, ws, v1.WorkspaceReady)
	g := NewWithT(t)
	g.Expect(ready.Status.Epoch).To(HaveValue(Equal(int64(1))))
	first := newTask(ns, "first", "s", `mkdir -p repo/empty && cd repo && echo kept > f && ln -s f link && export STAGE=one`)
	create(t, first)
	g.Expect(testutil.WaitTerminal(t, k8s, first.Namespace, []string{first.Name}, waitLong)[first.Name].Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))

	setSuspend(t, ws, true)
	suspended := waitSuspendedAndReleased(t, ws)
	g.Expect(suspended.Status.Snapshot).NotTo(BeNil())
	g.Expect(suspended.Status.Snapshot.Epoch).To(HaveValue(Equal(int64(1))))
	g.Expect(suspended.Status.Snapshot.Bytes).To(HaveValue(BeNumerically(">", 0)))

	g.Expect(suspended.Status.Message).To(HaveValue(ContainSubstring("spec.suspend holds it")), "the workspace's status must not promise that its next task restores it")
	refused := newTask(ns, "refused", "s", "true")
	created := time.Now()
	create(t, refused)
	done := testutil.WaitTerminal(t, k8s, refused.Namespace, []string{refused.Name}, waitLong)[refused.Name]
	g.Expect(time.Since(created)).To(BeNumerically("<", 5*time.Second), "refused at once, not after a wait")
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonWorkspaceUnavailable)), "status: %v", done.Status)
	g.Expect(done.Status.NodeName).To(BeNil(), "never dispatched")
	g.Expect(done.Status.Message).To(HaveValue(And(ContainSubstring(`BashWorkspace "s" is held by its spec.suspend`),
		ContainSubstring("kubectl bashtask workspace resume s"), ContainSubstring("spec.suspend to false"))))

	setSuspend(t, ws, false)
	waiting := newTask(ns, "waiting", "s", `pwd; echo "$STAGE"; cat f; readlink link; ls -d empty`)
	create(t, waiting)
	restored := waitPhase(t, ws, v1.WorkspaceReady)
	g.Expect(restored.Status.Epoch).To(HaveValue(Equal(int64(2))))
	g.Expect(restored.Status.RestoredFrom).NotTo(BeNil())
	g.Expect(restored.Status.RestoredFrom.URL).To(Equal(suspended.Status.Snapshot.URL))
	g.Expect(restored.Status.RestoredFrom.AgeSeconds).NotTo(BeNil())
	done = testutil.WaitTerminal(t, k8s, waiting.Namespace, []string{waiting.Name}, waitLong)[waiting.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %v", done.Status)
	g.Expect(stdout(done)).To(Equal(v1.WorkspacePath + "/repo\none\nkept\nf\nempty\n"))
	// The first task on the restored copy carries the notice, without a
	// lost node; the next one does not.
	later := newTask(ns, "later", "s", "true")
	create(t, later)
	tasks := testutil.WaitTerminal(t, k8s, ns, []string{waiting.Name, later.Name}, waitLong)
	g.Expect(restoreNotice(g, tasks, suspended.Status.Snapshot.URL, "").Name).To(Equal(waiting.Name))
}

// The idle timeout suspends a workspace by default; its next task
// restores it.
func TestIdleSuspendAndRestoreOnTask(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "idle", func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](1) })
	create(t, ws)
	// No wait for Ready: with a timeout of 1s its Ready stay can be too
	// short to observe. The task keeps the workspace until it ends.
	write := newTask(ns, "write", "s", "true")
	write.Spec.Workspace = ptr.To("idle")
	write.Spec.Command = "echo from-before > note"
	create(t, write)
	g := NewWithT(t)
	g.Expect(testutil.WaitTerminal(t, k8s, write.Namespace, []string{write.Name}, waitLong)[write.Name].Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	suspended := waitSuspendedAndReleased(t, ws)
	g.Expect(suspended.DeletionTimestamp).To(BeNil(), "suspended, not deleted")
	g.Expect(suspended.Status.Snapshot).NotTo(BeNil())
	g.Expect(suspended.Status.Message).To(HaveValue(HaveSuffix("its next task restores it on a node")))

	read := newTask(ns, "read", "idle", "cat note")
	create(t, read)
	done := testutil.WaitTerminal(t, k8s, read.Namespace, []string{read.Name}, waitLong)[read.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %v", done.Status)
	g.Expect(stdout(done)).To(Equal("from-before\n"))
	g.Expect(done.Status.NodeName).NotTo(BeNil())
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "idle") }).WithTimeout(10 * time.Second).Should(ContainElements(v1.WorkspaceReasonSuspended, v1.WorkspaceReasonRestored))
}

func setSuspend(t *testing.T, ws *v1.BashWorkspace, on bool) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		cur := getWorkspace(g, ws)
		cur.Spec.Suspend = ptr.To(on)
		g.Expect(k8s.Update(ctxBackground(), cur)).To(Succeed())
	}).WithTimeout(waitLong).Should(Succeed())
}

// waitSuspendedAndReleased waits for Suspended with no node left.
func waitSuspendedAndReleased(t *testing.T, ws *v1.BashWorkspace) *v1.BashWorkspace {
	t.Helper()
	var got *v1.BashWorkspace
	NewWithT(t).Eventually(func(g Gomega) {
		got = &v1.BashWorkspace{}
		g.Expect(k8s.Get(ctxBackground(), client.ObjectKeyFromObject(ws), got)).To(Succeed())
		g.Expect(got.Status.Phase).To(HaveValue(Equal(v1.WorkspaceSuspended)), "status: %+v", got.Status)
		g.Expect(got.Status.NodeName).To(BeNil())
	}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
	return got
}

// A workspace whose agent is lost after a snapshot is restored from it on
// another node by its next task, which sees the snapshot's files; the
// lost agent, back later with its copy of the old epoch, has that copy
// removed (and it never ran the new epoch's task).
func TestNodeLostRestoresElsewhere(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "mover", func(ws *v1.BashWorkspace) {
		ws.Spec.NodeSelector = map[string]string{"snapshot-test": "yes"}
	})
	// Two nodes fit it; the first placement takes one, the restore the other.
	for _, n := range []string{"node-a", "node-b"} {
		labelNode(t, n, "snapshot-test", "yes")
	}
	create(t, ws)
	ready := waitPhase(t, ws, v1.WorkspaceReady)
	first := *ready.Status.NodeName
	g := NewWithT(t)
	write := newTask(ns, "write", "mover", "echo before-the-loss > kept")
	create(t, write)
	g.Expect(testutil.WaitTerminal(t, k8s, write.Namespace, []string{write.Name}, waitLong)[write.Name].Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	NewWithT(t).Eventually(func(g Gomega) {
		cur := getWorkspace(g, ws)
		cur.Spec.Snapshot = &v1.WorkspaceSnapshotPolicy{Request: ptr.To("before-loss")}
		g.Expect(k8s.Update(ctxBackground(), cur)).To(Succeed())
	}).WithTimeout(waitLong).Should(Succeed())
	g.Eventually(func(g Gomega) *string {
		s := getWorkspace(g, ws).Status.Snapshot
		if s == nil {
			return nil
		}
		return s.Request
	}).WithTimeout(waitLong).Should(HaveValue(Equal("before-loss")))

	agent := rig.Agents[first]
	agent.Disconnect()
	reconnected := false
	t.Cleanup(func() {
		if !reconnected {
			_ = agent.Reconnect()
		}
	})
	suspended := waitSuspendedAndReleased(t, ws)
	g.Expect(suspended.Status.Message).To(HaveValue(ContainSubstring("unreachable")))
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "mover") }).WithTimeout(10 * time.Second).Should(ContainElement(v1.WorkspaceReasonNodeLost))

	// Two tasks at once after the loss: one of them, and only one,
	// carries the notice naming the lost node; a later task none.
	read, read2 := newTask(ns, "read", "mover", "cat kept"), newTask(ns, "read2", "mover", "cat kept")
	create(t, read)
	create(t, read2)
	both := testutil.WaitTerminal(t, k8s, read.Namespace, []string{read.Name, read2.Name}, waitLong)
	done := both[read.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %v", done.Status)
	g.Expect(stdout(done)).To(Equal("before-the-loss\n"))
	read3 := newTask(ns, "read3", "mover", "true")
	create(t, read3)
	both[read3.Name] = testutil.WaitTerminal(t, k8s, ns, []string{read3.Name}, waitLong)[read3.Name]
	g.Expect(restoreNotice(g, both, suspended.Status.Snapshot.URL, first).Name).NotTo(Equal(read3.Name))
	moved := getWorkspace(g, ws)
	g.Expect(*moved.Status.NodeName).NotTo(Equal(first))
	g.Expect(moved.Status.Epoch).To(HaveValue(Equal(int64(2))))
	g.Expect(moved.Status.RestoredFrom).NotTo(BeNil())
	g.Expect(moved.Status.RestoredFrom.LostNode).To(HaveValue(Equal(first)))
	g.Expect(moved.Status.NodeLoss).To(BeNil(), "moved into restoredFrom")

	// The old agent comes back holding epoch 1: the sweep removes it.
	g.Expect(agent.Reconnect()).To(Succeed())
	reconnected = true
	g.Eventually(func(g Gomega) []string {
		rig.Orphans.Sweep() // the periodic check, now: the agent's stream reconnects meanwhile
		return eventReasons(g, ns, "mover")
	}).WithTimeout(waitLong).WithPolling(500 * time.Millisecond).Should(ContainElement(controllers.ReasonStaleCopyRemoved))
	g.Expect(getWorkspace(g, ws).Status.NodeName).To(HaveValue(Equal(*moved.Status.NodeName)), "the current copy stays")
}

func labelNode(t *testing.T, node, key, value string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		var n corev1.Node
		g.Expect(k8s.Get(ctxBackground(), client.ObjectKey{Name: node}, &n)).To(Succeed())
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[key] = value
		g.Expect(k8s.Update(ctxBackground(), &n)).To(Succeed())
	}).WithTimeout(waitLong).Should(Succeed())
	t.Cleanup(func() {
		var n corev1.Node
		if err := k8s.Get(ctxBackground(), client.ObjectKey{Name: node}, &n); err == nil {
			delete(n.Labels, key)
			_ = k8s.Update(ctxBackground(), &n)
		}
	})
}

// kubectl cordon (or drain) of a workspace's node moves the workspace:
// once its tasks end it is snapshotted and released, and its next task
// restores it on a node that takes work, with its files. A workspace
// pinned to the node by spec.nodeName stays (TestCordonedNode).
func TestCordonMovesWorkspace(t *testing.T) {
	ns := newNamespace(t)
	for _, n := range []string{"node-a", "node-b"} {
		labelNode(t, n, "drain-test", "yes")
	}
	ws := newWorkspace(ns, "drained", func(ws *v1.BashWorkspace) {
		ws.Spec.NodeSelector = map[string]string{"drain-test": "yes"}
	})
	create(t, ws)
	first := *waitPhase(t, ws, v1.WorkspaceReady).Status.NodeName
	g := NewWithT(t)
	write := newTask(ns, "write", "drained", "echo written-before-the-drain > f")
	create(t, write)
	g.Expect(testutil.WaitTerminal(t, k8s, write.Namespace, []string{write.Name}, waitLong)[write.Name].Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))

	t.Cleanup(func() { setUnschedulable(t, first, false) })
	setUnschedulable(t, first, true)
	suspended := waitSuspendedAndReleased(t, ws)
	g.Expect(suspended.Status.Message).To(HaveValue(ContainSubstring("cordoned")))

	read := newTask(ns, "read", "drained", "cat f")
	create(t, read)
	done := testutil.WaitTerminal(t, k8s, read.Namespace, []string{read.Name}, waitLong)[read.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %v", done.Status)
	g.Expect(stdout(done)).To(Equal("written-before-the-drain\n"))
	g.Expect(done.Status.NodeName).NotTo(HaveValue(Equal(first)))
}

// spec.snapshot.intervalSeconds snapshots a workspace while a task runs:
// at once when it has none, then once per interval, each without stopping
// the task and without a request.
func TestSnapshotInterval(t *testing.T) {
	if testing.Short() {
		t.Skip("waits a minute: the shortest interval the API takes")
	}
	t.Parallel()
	ns := newNamespace(t)
	ws := newWorkspace(ns, "interval", func(ws *v1.BashWorkspace) {
		ws.Spec.Snapshot = &v1.WorkspaceSnapshotPolicy{IntervalSeconds: ptr.To[int32](60)}
	})
	create(t, ws)
	waitPhase(t, ws, v1.WorkspaceReady)
	long := newTask(ns, "long", "interval", `echo one > f; sleep 120`, func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](180) })
	create(t, long)
	g := NewWithT(t)
	var first *v1.WorkspaceSnapshotStatus
	g.Eventually(func(g Gomega) {
		first = getWorkspace(g, ws).Status.Snapshot
		g.Expect(first).NotTo(BeNil())
	}).WithTimeout(waitLong).WithPolling(100*time.Millisecond).Should(Succeed(), "a first snapshot once the task runs")
	g.Expect(first.Request).To(BeNil(), "taken for the interval, not asked for")
	var second *v1.WorkspaceSnapshotStatus
	g.Eventually(func(g Gomega) {
		second = getWorkspace(g, ws).Status.Snapshot
		g.Expect(second.URL).NotTo(Equal(first.URL))
	}).WithTimeout(90*time.Second).WithPolling(500*time.Millisecond).Should(Succeed(), "a second snapshot one interval later")
	gap := second.Time.Sub(first.Time.Time)
	g.Expect(gap).To(BeNumerically(">=", 59*time.Second), "not before the interval")
	g.Expect(gap).To(BeNumerically("<=", 75*time.Second), "not much after it")
	g.Expect(getTask(g, long).Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)), "the snapshots did not stop the task")
}
