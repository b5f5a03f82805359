package controllers_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testrig"
)

// orphanGone is how soon an orphan must have ended and been forgotten: a
// check, the kill grace (1 s) and one recheck.
const orphanGone = 10 * time.Second

// agentForgets waits until the agent no longer holds the task.
func agentForgets(t *testing.T, a *testrig.Agent, uid string) {
	t.Helper()
	NewWithT(t).Eventually(func() codes.Code {
		_, err := a.Server.Get(ctxBackground(), &agentv1.GetRequest{Uid: uid})
		return status.Code(err)
	}).WithTimeout(orphanGone).WithPolling(100*time.Millisecond).Should(Equal(codes.NotFound), "the agent of %s still holds task %s", a.Node, uid)
}

// startGhost starts a `sleep 600` on the agent directly, for a BashTask that
// never existed.
func startGhost(t *testing.T, a *testrig.Agent, ns, name string) string {
	t.Helper()
	uid := "ghost-" + ns + "-" + name
	_, err := a.Server.Start(t.Context(), &agentv1.StartRequest{Spec: &agentv1.TaskSpec{
		Ref:       &agentv1.TaskRef{Namespace: ns, Name: name, Uid: uid},
		Command:   "sleep 600",
		KillGrace: durationpb.New(time.Second),
	}})
	if err != nil {
		t.Fatalf("starting %s on %s: %v", name, a.Node, err)
	}
	return uid
}

// runningOn creates a task and waits until it runs on node.
func runningOn(t *testing.T, ns, name, node, command string) *v1.BashTask {
	t.Helper()
	bt := newTask(ns, name, command, func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To(node) })
	create(t, bt)
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(get(g, bt).Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
	}).WithTimeout(waitLong).Should(Succeed())
	return get(NewWithT(t), bt)
}

// TestOrphanFinalizerStrippedAndDeleted (C41): a running task whose
// finalizer is removed by hand and which is then deleted ends on its agent
// within seconds, and the agent forgets it.
func TestOrphanFinalizerStrippedAndDeleted(t *testing.T) {
	ns := newNamespace(t)
	bt := runningOn(t, ns, "stripped", "node-a", "sleep 600")
	g := NewWithT(t)
	g.Expect(k8s.Patch(t.Context(), bt, client.RawPatch(types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)))).To(Succeed())
	g.Expect(k8s.Delete(t.Context(), bt)).To(Succeed())
	agentForgets(t, rig.Agents["node-a"], string(bt.UID))
}

// TestOrphanFoundOnReconnect (C41): a task an agent holds for a BashTask
// that does not exist, which the controller never saw, is stopped and
// forgotten when the agent's Watch stream reconnects and lists it; a live
// task on the same agent runs on to its end.
func TestOrphanFoundOnReconnect(t *testing.T) {
	ns := newNamespace(t)
	a := rig.Agents["node-b"]
	live := runningOn(t, ns, "live", "node-b", "sleep 2; echo done")
	a.Disconnect() // well under --agent-lost-after
	uid := startGhost(t, a, ns, "ghost")
	g := NewWithT(t)
	g.Eventually(func() bool { return rig.Registry.Agent("node-b").Connected }).Should(BeFalse())
	g.Expect(a.Reconnect()).To(Succeed())
	// The periodic check (every minute) cannot be what finds it this soon.
	agentForgets(t, a, uid)
	got := waitTerminal(t, live)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
}

// TestOrphanFoundBySweep (C41): the periodic check finds a task whose
// BashTask never existed and leaves a live one alone.
func TestOrphanFoundBySweep(t *testing.T) {
	ns := newNamespace(t)
	a := rig.Agents["node-a"]
	live := runningOn(t, ns, "live", "node-a", "sleep 2; echo done")
	uid := startGhost(t, a, ns, "ghost")
	g := NewWithT(t)
	g.Eventually(func() bool { _, ok := rig.Registry.Latest("node-a", uid); return ok }).Should(BeTrue())
	rig.Orphans.Sweep() // what the --orphan-check-interval ticker does
	agentForgets(t, a, uid)
	got := waitTerminal(t, live)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
}
