package workspace_test

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// An agent asked to stop (SIGTERM, as for a DaemonSet rollout) moves its
// workspaces before it exits: it reports itself draining, stops the task
// still running in the workspace, and the controller snapshots the
// workspace (after the files were written, also the running task's) and
// releases it; the agent then stops, at once rather than at its timeout,
// though a workspace pinned to its node stays. The next task restores the
// workspace on the other node with every file.
func TestAgentShutdownMovesWorkspaces(t *testing.T) {
	ns := newNamespace(t)
	for _, n := range []string{"node-a", "node-b"} {
		labelNode(t, n, "shutdown-test", "yes")
	}
	ws := newWorkspace(ns, "moves", func(ws *v1.BashWorkspace) {
		ws.Spec.NodeSelector = map[string]string{"shutdown-test": "yes"}
	})
	create(t, ws)
	first := *waitPhase(t, ws, v1.WorkspaceReady).Status.NodeName
	other := map[string]string{"node-a": "node-b", "node-b": "node-a"}[first]
	pinned := newWorkspace(ns, "stays", func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To(first) })
	create(t, pinned)
	waitPhase(t, pinned, v1.WorkspaceReady)
	g := NewWithT(t)
	write := newTask(ns, "write", "moves", "mkdir -p src && echo written-before-the-stop > src/f")
	create(t, write)
	written := testutil.WaitTerminal(t, k8s, write.Namespace, []string{write.Name}, waitLong)[write.Name]
	g.Expect(written.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(written.Status))
	// Still running at the stop, past its SIGTERM by its grace period: the
	// agent's stop ends it, and its file moves too.
	running := newTask(ns, "running", "moves", `trap '' TERM; echo also-written > g; echo started; sleep 300`,
		func(bt *v1.BashTask) {
			bt.Spec.TimeoutSeconds = ptr.To[int32](600)
			bt.Spec.KillGracePeriodSeconds = ptr.To[int32](2)
		})
	create(t, running)
	g.Eventually(func(g Gomega) string { return stdout(getTask(g, running)) }).WithTimeout(waitLong).Should(Equal("started\n"))
	g.Expect(getWorkspace(g, ws).Status.Snapshot).To(BeNil(), "no snapshot before the stop")

	// Only this test's two workspaces are on the node when it stops: an
	// earlier test's workspace still being deleted would count as movable.
	g.Eventually(func(g Gomega) []string {
		held, err := rig.Registry.ListWorkspaces(t.Context(), first)
		g.Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, w := range held {
			names = append(names, w.GetRef().GetNamespace()+"/"+w.GetRef().GetName())
		}
		return names
	}).WithTimeout(waitLong).WithPolling(50*time.Millisecond).Should(ConsistOf(ns+"/moves", ns+"/stays"),
		"the agent on %s holds only this test's workspaces", first)

	a := rig.Agents[first]
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = rig.RestartAgent(first)
		}
	})
	const workspaceTimeout = time.Minute
	began := time.Now()
	drained := make(chan struct{})
	var res agent.DrainResult
	go func() {
		defer close(drained)
		res = a.Shutdown(workspaceTimeout)
	}()
	g.Eventually(func() agentpool.AgentState { return rig.Registry.Agent(first) }).WithTimeout(waitLong).WithPolling(10*time.Millisecond).
		Should(And(HaveField("Draining", BeTrue()), HaveField("Ready", BeFalse())), "the controller sees the agent draining")
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		g.Expect(st.Message).To(HaveValue(ContainSubstring("the agent on node " + first + " is shutting down: moving to another node")))
	}).WithTimeout(waitLong).WithPolling(20*time.Millisecond).Should(Succeed(), "the controller moves the workspace of a draining agent")

	select {
	case <-drained:
	case <-time.After(workspaceTimeout + 30*time.Second):
		t.Fatal("the agent did not stop")
	}
	took := time.Since(began)
	// The node goes on without this workspace: cordoned, so that the
	// restore lands on the other node, and its agent back at once (a
	// rollout's new pod, and within --agent-lost-after, which would lose
	// the pinned workspace), holding only the pinned one.
	g.Expect(rig.RestartAgent(first)).To(Succeed())
	restarted = true
	t.Cleanup(func() { setUnschedulable(t, first, false) })
	setUnschedulable(t, first, true)
	t.Logf("agent stopped %v after its shutdown began: %+v", took.Round(time.Millisecond), res)
	g.Expect(res.Movable).To(Equal(1), "the pinned workspace does not count")
	g.Expect(res.Left).To(Equal(0), "every workspace that may move moved")
	g.Expect(res.StoppedTasks).To(Equal(1))
	g.Expect(took).To(BeNumerically("<", workspaceTimeout/2), "the drain ended when the workspace was released, not at its timeout")

	stopped := testutil.WaitTerminal(t, k8s, running.Namespace, []string{running.Name}, waitLong)[running.Name]
	g.Expect(stopped.Status.Reason).To(HaveValue(Equal(v1.ReasonAgentRestarted)), "status: %s", dump.OneLine(stopped.Status))
	suspended := waitSuspendedAndReleased(t, ws)
	snap := suspended.Status.Snapshot
	g.Expect(snap).NotTo(BeNil())
	g.Expect(snap.Epoch).To(HaveValue(Equal(int64(1))))
	g.Expect(snap.Time).NotTo(BeNil())
	// The status keeps seconds: the snapshot began in or after the second
	// the last task ended.
	g.Expect(snap.Time.Time).To(BeTemporally(">=", stopped.Status.CompletionTime.Truncate(time.Second)), "the snapshot followed the stopped task")

	g.Eventually(func() bool { return rig.Registry.Agent(first).Ready }).WithTimeout(waitLong).Should(BeTrue())
	_, err := rig.Registry.GetWorkspace(t.Context(), first, string(ws.UID))
	g.Expect(errors.Is(err, agentpool.ErrWorkspaceUnknown)).To(BeTrue(), "the restarted agent still holds the moved workspace: %v", err)

	read := newTask(ns, "read", "moves", "cat src/f g")
	create(t, read)
	done := testutil.WaitTerminal(t, k8s, read.Namespace, []string{read.Name}, waitLong)[read.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(stdout(done)).To(Equal("written-before-the-stop\nalso-written\n"))
	g.Expect(done.Status.NodeName).To(HaveValue(Equal(other)))
	moved := getWorkspace(g, ws)
	g.Expect(moved.Status.Epoch).To(HaveValue(Equal(int64(2))))
	g.Expect(moved.Status.RestoredFrom).NotTo(BeNil())
	g.Expect(moved.Status.RestoredFrom.URL).To(Equal(snap.URL))

	stays := getWorkspace(g, pinned)
	g.Expect(stays.Status.Phase).To(HaveValue(Equal(v1.WorkspaceReady)), "status: %s", dump.OneLine(stays.Status))
	g.Expect(stays.Status.NodeName).To(HaveValue(Equal(first)))
	g.Expect(stays.Status.Snapshot).To(BeNil(), "a pinned workspace is not moved")
}
