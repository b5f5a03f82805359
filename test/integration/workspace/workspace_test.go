package workspace_test

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/agentpool"
	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

const waitLong = 30 * time.Second

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ws-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func newWorkspace(ns, name string, mutate ...func(*v1.BashWorkspace)) *v1.BashWorkspace {
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, m := range mutate {
		m(ws)
	}
	return ws
}

func newTask(ns, name, workspace, command string, mutate ...func(*v1.BashTask)) *v1.BashTask {
	bt := &v1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.BashTaskSpec{Command: command, Workspace: ptr.To(workspace),
			TimeoutSeconds: ptr.To[int32](30), KillGracePeriodSeconds: ptr.To[int32](1)},
	}
	for _, m := range mutate {
		m(bt)
	}
	return bt
}

func owner(o string) func(*v1.BashTask) { return func(bt *v1.BashTask) { bt.Spec.Owner = ptr.To(o) } }

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := k8s.Create(t.Context(), o); err != nil {
		t.Fatalf("creating %s: %v", o.GetName(), err)
	}
}

func getWorkspace(g Gomega, ws *v1.BashWorkspace) *v1.BashWorkspace {
	out := &v1.BashWorkspace{}
	g.Expect(k8s.Get(ctxBackground(), client.ObjectKeyFromObject(ws), out)).To(Succeed())
	return out
}

func getTask(g Gomega, bt *v1.BashTask) *v1.BashTask {
	out := &v1.BashTask{}
	g.Expect(k8s.Get(ctxBackground(), client.ObjectKeyFromObject(bt), out)).To(Succeed())
	return out
}

// waitPhase waits for the workspace's phase and returns the workspace.
func waitPhase(t *testing.T, ws *v1.BashWorkspace, phase v1.WorkspacePhase) *v1.BashWorkspace {
	t.Helper()
	var got *v1.BashWorkspace
	NewWithT(t).Eventually(func(g Gomega) {
		got = getWorkspace(g, ws)
		g.Expect(got.Status.Phase).To(HaveValue(Equal(phase)), "status: %s", dump.OneLine(got.Status))
	}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
	return got
}

func waitGone(t *testing.T, o client.Object, timeout time.Duration) {
	t.Helper()
	NewWithT(t).Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctxBackground(), client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object)))
	}).WithTimeout(timeout).WithPolling(50*time.Millisecond).Should(BeTrue(), "%s still exists", o.GetName())
}

func stdout(bt *v1.BashTask) string {
	if bt.Status.Stdout == nil {
		return ""
	}
	return ptr.Deref(bt.Status.Stdout.Tail, "")
}

// eventReasons lists the reasons of the events about the object named name.
func eventReasons(g Gomega, ns, name string) []string {
	var list eventsv1.EventList
	g.Expect(k8s.List(ctxBackground(), &list, client.InNamespace(ns))).To(Succeed())
	var got []string
	for _, ev := range list.Items {
		if ev.Regarding.Name == name {
			got = append(got, ev.Reason)
		}
	}
	slices.Sort(got)
	return got
}

// A workspace is made on its node and its status says what the agent
// holds; its tasks run there as its UID, share its files, start where the
// last one ended, and resolve a relative workingDir inside it.
func TestWorkspaceRunsTasks(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "w", func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("s1") })
	create(t, ws)
	got := waitPhase(t, ws, v1.WorkspaceReady)
	g := NewWithT(t)
	st := got.Status
	g.Expect(got.Finalizers).To(ContainElement(controllers.WorkspaceFinalizer))
	g.Expect(st.NodeName).To(HaveValue(Not(BeEmpty())))
	g.Expect(st.RunAsUser).To(HaveValue(BeNumerically(">", 0)))
	g.Expect(st.Path).To(HaveValue(Equal(v1.WorkspacePath)))
	g.Expect(st.WorkingDir).To(HaveValue(Equal(v1.WorkspacePath)))
	g.Expect(st.RunningTasks).To(HaveValue(BeEquivalentTo(0)))
	g.Expect(st.ObservedGeneration).To(HaveValue(Equal(got.Generation)))
	if st.CapacityBytes == nil {
		g.Expect(st.UsedBytes).To(BeNil())
		g.Expect(st.Message).To(HaveValue(ContainSubstring("cannot cap its storage")))
	} else {
		g.Expect(st.UsedBytes).NotTo(BeNil())
	}
	g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReady)).To(BeTrue(), "conditions: %v", st.Conditions)
	g.Expect(meta.FindStatusCondition(st.Conditions, v1.ConditionReconciling)).To(BeNil())
	g.Expect(meta.FindStatusCondition(st.Conditions, v1.ConditionStalled)).To(BeNil())

	first := newTask(ns, "first", "w", "echo hi > a.txt && mkdir sub sub2 && cd sub", owner("s1"))
	create(t, first)
	done := testutil.WaitTerminal(t, k8s, first.Namespace, []string{first.Name}, waitLong)[first.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(done.Status.NodeName).To(Equal(st.NodeName), "a task runs on its workspace's node")
	g.Expect(done.Status.WorkingDir).To(HaveValue(Equal(v1.WorkspacePath)))

	second := newTask(ns, "second", "w", "cat ../a.txt; pwd; id -u", owner("s1"))
	create(t, second)
	done = testutil.WaitTerminal(t, k8s, second.Namespace, []string{second.Name}, waitLong)[second.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(stdout(done)).To(Equal("hi\n" + v1.WorkspacePath + "/sub\n" + itoa(*st.RunAsUser) + "\n"))
	g.Expect(done.Status.WorkingDir).To(HaveValue(Equal(v1.WorkspacePath + "/sub")))

	third := newTask(ns, "third", "w", "pwd", owner("s1"), func(bt *v1.BashTask) { bt.Spec.WorkingDir = ptr.To("sub2") })
	create(t, third)
	done = testutil.WaitTerminal(t, k8s, third.Namespace, []string{third.Name}, waitLong)[third.Name]
	g.Expect(stdout(done)).To(Equal(v1.WorkspacePath + "/sub2\n"))
	g.Expect(done.Status.WorkingDir).To(HaveValue(Equal(v1.WorkspacePath + "/sub2")))

	// The workspace's status follows its tasks' ends.
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		g.Expect(st.WorkingDir).To(HaveValue(Equal(v1.WorkspacePath + "/sub2")))
		g.Expect(st.LastTaskTime).NotTo(BeNil())
		g.Expect(st.RunningTasks).To(HaveValue(BeEquivalentTo(0)))
	}).WithTimeout(10 * time.Second).Should(Succeed())
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "w") }).WithTimeout(10 * time.Second).Should(ContainElement(v1.WorkspaceReasonReady))
}

// A task that names a workspace that does not exist yet waits for it with
// a condition that says so, and runs once it is made: a GitOps apply of
// both works in any order.
func TestGitOpsOrder(t *testing.T) {
	ns := newNamespace(t)
	bt := newTask(ns, "early", "late", "echo ran")
	create(t, bt)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := getTask(g, bt).Status
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil(), "status: %s", dump.OneLine(st))
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(controllers.ReasonWorkspaceNotFound))
		g.Expect(c.Message).To(ContainSubstring(`BashWorkspace "late"`))
		g.Expect(st.Phase).To(HaveValue(Equal(v1.PhasePending)))
		g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReconciling)).To(BeTrue())
	}).WithTimeout(waitLong).Should(Succeed())
	g.Consistently(func(g Gomega) { g.Expect(getTask(g, bt).Status.Reason).To(BeNil()) }).WithTimeout(time.Second).Should(Succeed())

	create(t, newWorkspace(ns, "late"))
	done := testutil.WaitTerminal(t, k8s, bt.Namespace, []string{bt.Name}, waitLong)[bt.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(stdout(done)).To(Equal("ran\n"))
}

// A workspace with an owner runs only that owner's tasks; the refusal
// names both owners. A workspace without one runs anyone's.
func TestOwnerMismatch(t *testing.T) {
	ns := newNamespace(t)
	create(t, newWorkspace(ns, "alices", func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("alice") }))
	create(t, newWorkspace(ns, "open"))
	tests := map[string]struct {
		task       *v1.BashTask
		wantReason v1.Reason
		wantIn     []string
	}{
		"another owner": {task: newTask(ns, "bobs", "alices", "true", owner("bob")), wantReason: v1.ReasonInvalidSpec, wantIn: []string{`"bob"`, `"alice"`, `"alices"`}},
		"no owner":      {task: newTask(ns, "nobodys", "alices", "true"), wantReason: v1.ReasonInvalidSpec, wantIn: []string{"unset", `"alice"`}},
		"the owner":     {task: newTask(ns, "alice-runs", "alices", "true", owner("alice")), wantReason: v1.ReasonSucceeded},
		"open to all":   {task: newTask(ns, "carols", "open", "true", owner("carol")), wantReason: v1.ReasonSucceeded},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			create(t, tc.task)
			done := testutil.WaitTerminal(t, k8s, tc.task.Namespace, []string{tc.task.Name}, waitLong)[tc.task.Name]
			g := NewWithT(t)
			g.Expect(done.Status.Reason).To(HaveValue(Equal(tc.wantReason)), "status: %s", dump.OneLine(done.Status))
			for _, w := range tc.wantIn {
				g.Expect(done.Status.Message).To(HaveValue(ContainSubstring(w)))
			}
			if tc.wantReason == v1.ReasonInvalidSpec {
				g.Expect(done.Status.NodeName).To(BeNil(), "a refused task is never dispatched")
			}
		})
	}
}

// Deleting a workspace stops its running task (Cancelled), keeps the
// status and output of the tasks that ended, and removes the workspace
// from its agent before the object goes.
func TestDeleteWhileTaskRuns(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "doomed")
	create(t, ws)
	ready := waitPhase(t, ws, v1.WorkspaceReady)
	node := *ready.Status.NodeName

	ended := newTask(ns, "ended", "doomed", "echo kept")
	create(t, ended)
	g := NewWithT(t)
	g.Expect(testutil.WaitTerminal(t, k8s, ended.Namespace, []string{ended.Name}, waitLong)[ended.Name].Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	running := newTask(ns, "running", "doomed", "echo started; exec sleep 600", func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](600) })
	create(t, running)
	g.Eventually(func(g Gomega) {
		st := getTask(g, running).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
		g.Expect(st.Stdout).NotTo(BeNil())
		g.Expect(st.Stdout.Tail).To(HaveValue(Equal("started\n")))
	}).WithTimeout(waitLong).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getWorkspace(g, ws).Status.RunningTasks).To(HaveValue(BeEquivalentTo(1)))
	}).WithTimeout(10*time.Second).Should(Succeed(), "runningTasks follows the agent")

	g.Expect(k8s.Delete(t.Context(), ws)).To(Succeed())
	cancelled := testutil.WaitTerminal(t, k8s, running.Namespace, []string{running.Name}, waitLong)[running.Name]
	g.Expect(cancelled.Status.Reason).To(HaveValue(Equal(v1.ReasonCancelled)), "status: %s", dump.OneLine(cancelled.Status))
	waitGone(t, ws, waitLong)
	_, err := rig.Registry.GetWorkspace(t.Context(), node, string(ready.UID))
	g.Expect(errors.Is(err, agentpool.ErrWorkspaceUnknown)).To(BeTrue(), "the agent still holds the workspace: %v", err)

	kept := getTask(g, ended)
	g.Expect(kept.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	g.Expect(stdout(kept)).To(Equal("kept\n"), "a task that ended keeps its output")
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "doomed") }).WithTimeout(10 * time.Second).Should(ContainElement(controllers.ReasonDeleted))

	// A task naming the deleted workspace waits for one of that name.
	after := newTask(ns, "after", "doomed", "true")
	create(t, after)
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getTask(g, after).Status.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(controllers.ReasonWorkspaceNotFound))
	}).WithTimeout(waitLong).Should(Succeed())
}

// A workspace without a running task for spec.idleTimeoutSeconds is
// deleted; a running task keeps it, and so does a GitOps tool's label.
func TestIdleTimeout(t *testing.T) {
	ns := newNamespace(t)
	deleteIdle := func(ws *v1.BashWorkspace) { ws.Spec.IdleAction = ptr.To(v1.WorkspaceIdleDelete) }
	idle := newWorkspace(ns, "idle", deleteIdle, func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](2) })
	busy := newWorkspace(ns, "busy", deleteIdle, func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](2) })
	managed := newWorkspace(ns, "managed", deleteIdle, func(ws *v1.BashWorkspace) {
		ws.Spec.IdleTimeoutSeconds = ptr.To[int32](1)
		ws.Labels = map[string]string{controllers.LabelFluxKustomizationName: "apps"}
	})
	for _, ws := range []*v1.BashWorkspace{idle, busy, managed} {
		create(t, ws)
	}
	waitPhase(t, busy, v1.WorkspaceReady)
	sleeper := newTask(ns, "sleeper", "busy", "sleep 8")
	create(t, sleeper)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		g.Expect(getTask(g, sleeper).Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
	}).WithTimeout(waitLong).Should(Succeed())

	// The idle one is deleted (its removal from the node may take longer).
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "idle") }).WithTimeout(15 * time.Second).Should(ContainElement(controllers.ReasonIdleTimeout))
	g.Expect(getTask(g, sleeper).Status.Reason).To(BeNil(), "the busy workspace's task still runs")
	g.Expect(getWorkspace(g, busy).DeletionTimestamp).To(BeNil(), "a workspace with a running task is not idle")

	done := testutil.WaitTerminal(t, k8s, sleeper.Namespace, []string{sleeper.Name}, waitLong)[sleeper.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "the idle timeout never cuts a task short")
	waitGone(t, busy, waitLong)
	waitGone(t, idle, waitLong)

	g.Expect(getWorkspace(g, managed).Status.Phase).To(HaveValue(Equal(v1.WorkspaceReady)))
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "managed") }).WithTimeout(10 * time.Second).
		Should(ConsistOf(v1.WorkspaceReasonReady, controllers.ReasonKeptPastIdleTimeout))
	g.Consistently(func(g Gomega) []string { return eventReasons(g, ns, "managed") }).WithTimeout(2*time.Second).
		Should(ConsistOf(v1.WorkspaceReasonReady, controllers.ReasonKeptPastIdleTimeout), "one event, not one per pass")
}

// A workspace whose agent stays unreachable past --agent-lost-after is
// NodeLost: the object is kept, tasks naming it are refused
// (WorkspaceUnavailable), and deleting it does not wait for the agent.
// The workspace runs no task, so only the agent's disconnect, not a
// periodic read, can start the count in time (the idle refresh is
// minutes, waitPhase waits 30 s).
func TestAgentLost(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "far", func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To("node-c") })
	create(t, ws)
	waitPhase(t, ws, v1.WorkspaceReady)
	agent := rig.Agents["node-c"]
	agent.Disconnect()
	t.Cleanup(func() { _ = agent.Reconnect() })
	lostAt := time.Now()
	lost := waitPhase(t, ws, v1.WorkspaceNodeLost)
	g := NewWithT(t)
	g.Expect(time.Since(lostAt)).To(BeNumerically(">=", agentLostAfter-500*time.Millisecond))
	g.Expect(lost.Status.Message).To(HaveValue(ContainSubstring("unreachable")))
	g.Expect(meta.IsStatusConditionTrue(lost.Status.Conditions, v1.ConditionStalled)).To(BeTrue())
	g.Expect(meta.IsStatusConditionFalse(lost.Status.Conditions, v1.ConditionReady)).To(BeTrue())
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "far") }).WithTimeout(10 * time.Second).Should(ContainElement(v1.WorkspaceReasonNodeLost))

	refused := newTask(ns, "refused", "far", "true")
	create(t, refused)
	done := testutil.WaitTerminal(t, k8s, refused.Namespace, []string{refused.Name}, waitLong)[refused.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonWorkspaceUnavailable)))
	g.Expect(done.Status.Message).To(HaveValue(ContainSubstring("NodeLost")))

	g.Expect(k8s.Delete(t.Context(), ws)).To(Succeed())
	waitGone(t, ws, waitLong)
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "far") }).WithTimeout(10 * time.Second).Should(ContainElement(controllers.ReasonDeletedWithoutAgent))
}

// A workspace whose Node is deleted is NodeLost at once; its agent, still
// there, removes it when the object is deleted.
func TestNodeDeleted(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "gone-node", func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To("node-d") })
	create(t, ws)
	ready := waitPhase(t, ws, v1.WorkspaceReady)
	g := NewWithT(t)
	g.Expect(k8s.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-d"}})).To(Succeed())
	lost := waitPhase(t, ws, v1.WorkspaceNodeLost)
	g.Expect(lost.Status.Message).To(HaveValue(ContainSubstring("node node-d was deleted")))
	g.Expect(k8s.Delete(t.Context(), ws)).To(Succeed())
	waitGone(t, ws, waitLong)
	_, err := rig.Registry.GetWorkspace(t.Context(), "node-d", string(ready.UID))
	g.Expect(errors.Is(err, agentpool.ErrWorkspaceUnknown)).To(BeTrue(), "the agent still holds the workspace: %v", err)
}

// Placement follows spec.nodeSelector; a workspace no agent can make
// waits with a message, and one its agent refuses is Failed.
func TestPlacement(t *testing.T) {
	ns := newNamespace(t)
	inB := newWorkspace(ns, "in-b", func(ws *v1.BashWorkspace) { ws.Spec.NodeSelector = map[string]string{"zone": "b"} })
	egress := newWorkspace(ns, "egress", func(ws *v1.BashWorkspace) { ws.Spec.Network = ptr.To(v1.NetworkEgress) })
	create(t, inB)
	create(t, egress)
	g := NewWithT(t)
	g.Expect(waitPhase(t, inB, v1.WorkspaceReady).Status.NodeName).To(HaveValue(Equal("node-b")))
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, egress).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.WorkspacePending)))
		g.Expect(st.NodeName).To(BeNil(), "nothing is written ahead before an agent fits")
		g.Expect(st.Message).To(HaveValue(ContainSubstring("egress capability")))
		g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReconciling)).To(BeTrue())
	}).WithTimeout(waitLong).Should(Succeed())

	// A subtest of its own, so that a host without a disk cap skips only
	// this part, visibly, and CI (BASHTASK_STRICT=1) fails instead.
	t.Run("storage over the disk cap", func(t *testing.T) {
		if rig.Registry.Agent("node-a").DiskCap == 0 {
			testutil.SkipUnlessStrict(t, "the agents cap no disk here (no loop devices or mkfs.ext4): the refusal of a storage size over the cap is not checked")
		}
		g := NewWithT(t)
		big := newWorkspace(ns, "too-big", func(ws *v1.BashWorkspace) {
			ws.Spec.Storage = ptr.To(resource.MustParse("16Ti"))
			ws.Spec.NodeName = ptr.To("node-a")
		})
		create(t, big)
		failed := waitPhase(t, big, v1.WorkspaceFailed)
		g.Expect(failed.Status.Message).To(HaveValue(ContainSubstring("--task-disk-cap")))
		g.Expect(meta.IsStatusConditionTrue(failed.Status.Conditions, v1.ConditionStalled)).To(BeTrue())
		stalled := meta.FindStatusCondition(failed.Status.Conditions, v1.ConditionStalled)
		g.Expect(stalled.Reason).To(Equal(v1.WorkspaceReasonInvalidSpec))
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The uninstall hook (ReleaseTasks) removes the finalizer of a workspace
// and leaves it on its node; the controller does not put it back.
func TestReleaseKeepsWorkspaces(t *testing.T) {
	ns := newNamespace(t)
	ws := newWorkspace(ns, "kept")
	create(t, ws)
	ready := waitPhase(t, ws, v1.WorkspaceReady)
	node := *ready.Status.NodeName
	g := NewWithT(t)
	g.Expect(controllers.ReleaseTasks(t.Context(), k8s, controllers.ReleaseOptions{Namespace: ns, Timeout: waitLong, Logf: t.Logf})).To(Succeed())
	g.Consistently(func(g Gomega) {
		got := getWorkspace(g, ws)
		g.Expect(got.Finalizers).NotTo(ContainElement(controllers.WorkspaceFinalizer))
		g.Expect(got.Status.Phase).To(HaveValue(Equal(v1.WorkspaceReady)))
	}).WithTimeout(2 * time.Second).Should(Succeed())
	_, err := rig.Registry.GetWorkspace(t.Context(), node, string(ready.UID))
	g.Expect(err).NotTo(HaveOccurred(), "the released workspace stays on its node")

	// Without the finalizer the object goes at once; the agent's copy is
	// removed by hand here, as an operator would after an uninstall
	// (retried, as the controller retries a removal the agent could not
	// finish yet).
	g.Eventually(func() error {
		_, err := rig.Registry.DeleteWorkspace(t.Context(), node, string(ready.UID))
		return err
	}).WithTimeout(waitLong).WithPolling(time.Second).Should(Succeed())
	g.Expect(k8s.Delete(t.Context(), ws)).To(Succeed())
	waitGone(t, ws, waitLong)
}

// setUnschedulable cordons (true) or uncordons the Node, as kubectl does.
func setUnschedulable(t *testing.T, name string, on bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := k8s.Get(ctxBackground(), client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		n.Spec.Unschedulable = on
		return k8s.Update(ctxBackground(), &n)
	})
	if err != nil {
		t.Fatalf("setting spec.unschedulable of Node %s to %t: %v", name, on, err)
	}
}

// A new workspace is not placed on a cordoned node: it waits Pending
// naming the node and is made there once it is uncordoned. The tasks of a
// workspace already on a cordoned node still run there, where its files
// are.
func TestCordonedNode(t *testing.T) {
	ns := newNamespace(t)
	t.Cleanup(func() { setUnschedulable(t, "node-b", false) })
	setUnschedulable(t, "node-b", true)
	ws := newWorkspace(ns, "cordoned", func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To("node-b") })
	create(t, ws)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.WorkspacePending)), "status: %s", dump.OneLine(st))
		g.Expect(st.Message).To(HaveValue(ContainSubstring("node node-b is cordoned (spec.unschedulable)")))
		g.Expect(st.NodeName).To(BeNil(), "placed on a cordoned node")
	}).WithTimeout(waitLong).Should(Succeed())

	setUnschedulable(t, "node-b", false)
	g.Expect(waitPhase(t, ws, v1.WorkspaceReady).Status.NodeName).To(HaveValue(Equal("node-b")))

	setUnschedulable(t, "node-b", true)
	// A new workspace waiting shows the controller has seen the cordon.
	other := newWorkspace(ns, "waits", func(ws *v1.BashWorkspace) { ws.Spec.NodeSelector = map[string]string{"zone": "b"} })
	create(t, other)
	g.Eventually(func(g Gomega) {
		g.Expect(getWorkspace(g, other).Status.Message).To(HaveValue(ContainSubstring("node node-b is cordoned")))
	}).WithTimeout(waitLong).Should(Succeed())
	bt := newTask(ns, "in-cordoned", "cordoned", "echo here")
	create(t, bt)
	got := testutil.WaitTerminal(t, k8s, bt.Namespace, []string{bt.Name}, waitLong)[bt.Name]
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(got.Status))
	g.Expect(got.Status.NodeName).To(HaveValue(Equal("node-b")))
	g.Expect(stdout(got)).To(Equal("here\n"))
}
