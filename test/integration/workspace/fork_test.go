package workspace_test

import (
	"time"

	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// forkOf makes a workspace a fork of source.
func forkOf(source string) func(*v1.BashWorkspace) {
	return func(ws *v1.BashWorkspace) { ws.Spec.Source = &v1.WorkspaceSource{Workspace: source} }
}

// runIn runs command in workspace ws as owner o and returns the task at
// its end, failing unless it succeeded.
func runIn(t *testing.T, ns, name, ws, o, command string) *v1.BashTask {
	t.Helper()
	bt := newTask(ns, name, ws, command)
	if o != "" {
		owner(o)(bt)
	}
	create(t, bt)
	done := testutil.WaitTerminal(t, k8s, ns, []string{name}, waitLong)[name]
	NewWithT(t).Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "%s: %v", name, done.Status)
	return done
}

// A fork of a Ready workspace is made on its node by a local copy: the
// source's files, carried directory and variables, a UID of its own, and
// a status naming the source and the freeze; the fork's writes do not
// reach the source. A fork naming another owner is refused, naming both.
func TestForkSameNodeAndOwner(t *testing.T) {
	ns := newNamespace(t)
	deleteWorkspacesAtEnd(t, ns)
	carry := func(ws *v1.BashWorkspace) {
		ws.Spec.Owner = ptr.To("o1")
		ws.Spec.CarryOver = &v1.CarryOver{Environment: ptr.To(true)}
	}
	src := newWorkspace(ns, "src", carry)
	create(t, src)
	ready := waitPhase(t, src, v1.WorkspaceReady)
	runIn(t, ns, "write", "src", "o1", `mkdir -p repo && cd repo && echo one > f && export STAGE=built`)

	fork := newWorkspace(ns, "copy", carry, forkOf("src"))
	create(t, fork)
	got := waitPhase(t, fork, v1.WorkspaceReady)
	g := NewWithT(t)
	g.Expect(got.Status.NodeName).To(Equal(ready.Status.NodeName), "same node")
	g.Expect(got.Status.RunAsUser).NotTo(Equal(ready.Status.RunAsUser))
	f := got.Status.ForkedFrom
	g.Expect(f).NotTo(BeNil())
	g.Expect(f.Workspace).To(HaveValue(Equal("src")))
	g.Expect(f.UID).To(HaveValue(Equal(string(ready.UID))))
	g.Expect(f.Method).To(HaveValue(BeElementOf(v1.WorkspaceForkSparseCopy, v1.WorkspaceForkReflink, v1.WorkspaceForkArchive)))
	g.Expect(f.Time).NotTo(BeNil())
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "copy") }).WithTimeout(10 * time.Second).Should(ContainElement(v1.WorkspaceReasonForked))
	done := runIn(t, ns, "read", "copy", "o1", `pwd; echo "$STAGE"; cat f; echo two > f`)
	g.Expect(stdout(done)).To(Equal(v1.WorkspacePath + "/repo\nbuilt\none\n"))
	g.Expect(stdout(runIn(t, ns, "again", "src", "o1", `cat f`))).To(Equal("one\n"), "the fork's write stays in the fork")

	// The Go client's Fork: two copies at once, the source's owner and
	// carry-over taken, both Ready when it returns.
	bc, err := btclient.New(rig.Env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	copies, err := bc.Fork(t.Context(), btclient.ForkOptions{Namespace: ns, Source: "src", Count: 2, NamePrefix: "try-"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(copies).To(HaveLen(2))
	for _, c := range copies {
		g.Expect(c.Name).To(HavePrefix("try-"))
		g.Expect(c.Spec.Owner).To(HaveValue(Equal("o1")))
		g.Expect(c.Status.Phase).To(HaveValue(Equal(v1.WorkspaceReady)))
		g.Expect(c.Status.ForkedFrom).NotTo(BeNil())
		g.Expect(stdout(runIn(t, ns, "read-"+c.Name, c.Name, "o1", `echo "$STAGE"; cat f`))).To(Equal("built\none\n"))
	}

	other := newWorkspace(ns, "theirs", forkOf("src"), func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("o2") })
	create(t, other)
	refused := waitPhase(t, other, v1.WorkspaceFailed)
	g.Expect(refused.Status.Message).To(HaveValue(And(ContainSubstring(`owner "o1"`), ContainSubstring(`owner "o2"`), ContainSubstring("spec.source.workspace"))))
	g.Expect(refused.Status.RunAsUser).To(BeNil(), "nothing was made")
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "theirs") }).WithTimeout(10 * time.Second).Should(ContainElement(v1.WorkspaceReasonForkRefused))
}

// A fork placed on another node than its source goes through a snapshot
// of the source, which stays Ready on its node; a fork of a suspended
// workspace is restored from its last snapshot.
func TestForkAcrossNodesAndSuspended(t *testing.T) {
	ns := newNamespace(t)
	deleteWorkspacesAtEnd(t, ns)
	src := newWorkspace(ns, "src", func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To("node-a") })
	create(t, src)
	waitPhase(t, src, v1.WorkspaceReady)
	runIn(t, ns, "write", "src", "", `echo one > f`)

	far := newWorkspace(ns, "far", forkOf("src"), func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To("node-b") })
	create(t, far)
	got := waitPhase(t, far, v1.WorkspaceReady)
	g := NewWithT(t)
	g.Expect(got.Status.NodeName).To(HaveValue(Equal("node-b")))
	g.Expect(got.Status.ForkedFrom).NotTo(BeNil())
	g.Expect(got.Status.ForkedFrom.Method).To(HaveValue(Equal(v1.WorkspaceForkSnapshot)))
	g.Expect(got.Status.ForkedFrom.SnapshotURL).To(HaveValue(ContainSubstring("/workspaces/" + ns + "/src/")))
	g.Expect(stdout(runIn(t, ns, "read-far", "far", "", `cat f`))).To(Equal("one\n"))
	g.Expect(getWorkspace(g, src).Status.Phase).To(HaveValue(Equal(v1.WorkspaceReady)), "the source keeps running")

	setSuspend(t, src, true)
	waitSuspendedAndReleased(t, src)
	late := newWorkspace(ns, "late", forkOf("src"))
	create(t, late)
	got = waitPhase(t, late, v1.WorkspaceReady)
	g.Expect(got.Status.ForkedFrom.Method).To(HaveValue(Equal(v1.WorkspaceForkSnapshot)))
	g.Expect(stdout(runIn(t, ns, "read-late", "late", "", `cat f`))).To(Equal("one\n"))
	g.Expect(getWorkspace(g, src).Status.Phase).To(HaveValue(Equal(v1.WorkspaceSuspended)), "the source stays suspended")
}

// deleteWorkspacesAtEnd deletes ns's workspaces when the test ends and
// waits until they are gone, so that the agents hold none of them when a
// later test of the package runs (TestAgentShutdownMovesWorkspaces counts
// the workspaces a draining agent would move).
func deleteWorkspacesAtEnd(t *testing.T, ns string) {
	t.Cleanup(func() {
		var list v1.BashWorkspaceList
		if err := k8s.List(ctxBackground(), &list, client.InNamespace(ns)); err != nil {
			t.Errorf("listing the workspaces of %s: %v", ns, err)
			return
		}
		for i := range list.Items {
			if err := k8s.Delete(ctxBackground(), &list.Items[i]); client.IgnoreNotFound(err) != nil {
				t.Errorf("deleting workspace %s: %v", list.Items[i].Name, err)
			}
		}
		for i := range list.Items {
			waitGone(t, &list.Items[i], waitLong)
		}
	})
}
