package controllers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// stateNode is the suite's node for the scheduling-state tests; no other
// test names it.
const stateNode = "node-d"

// editNode changes the Node's spec (and labels) with change, and its
// status with status when not nil, retrying on conflicts. It also runs in
// cleanups, after t.Context is done.
func editNode(t *testing.T, name string, change func(*corev1.Node), status func(*corev1.NodeStatus)) {
	t.Helper()
	ctx := ctxBackground()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		if change != nil {
			change(&n)
			if err := k8s.Update(ctx, &n); err != nil {
				return err
			}
		}
		if status != nil {
			status(&n.Status)
			return k8s.Status().Update(ctx, &n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("editing Node %s: %v", name, err)
	}
}

// setReady sets the Node's Ready condition to s (with reason), or removes
// every condition for s "".
func setReady(s corev1.ConditionStatus, reason string) func(*corev1.NodeStatus) {
	return func(st *corev1.NodeStatus) {
		if s == "" {
			st.Conditions = nil
			return
		}
		now := metav1.Now()
		st.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}}
	}
}

// restoreNode makes the Node schedulable, untainted and Ready again.
func restoreNode(t *testing.T, name string) {
	t.Helper()
	editNode(t, name, func(n *corev1.Node) {
		n.Spec.Unschedulable = false
		n.Spec.Taints = nil
	}, setReady(corev1.ConditionTrue, "LocalAgent"))
}

func taint(key string, effect corev1.TaintEffect) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: "x", Effect: effect})
	}
}

// waitUnschedulable waits for the task to wait with
// Scheduled=False/NodeUnschedulable and a message containing want, not
// dispatched.
func waitUnschedulable(t *testing.T, bt *v1.BashTask, want string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		got := get(g, bt)
		c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil(), "status: %s", dump.OneLine(got.Status))
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(controllers.ReasonNodeUnschedulable), "message: %s", c.Message)
		g.Expect(c.Message).To(ContainSubstring(want))
		g.Expect(got.Status.NodeName).To(BeNil(), "dispatched to an unschedulable node")
		g.Expect(got.Status.Phase).To(HaveValue(Equal(v1.PhasePending)))
	}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
}

// A task for a node that takes no new work waits Pending with
// Scheduled=False/NodeUnschedulable naming the node and why, and runs
// there once the node takes work again.
func TestNodeSchedulingStateHoldsTasks(t *testing.T) {
	ns := newNamespace(t)
	t.Cleanup(func() { restoreNode(t, stateNode) })
	tests := map[string]struct {
		change   func(*corev1.Node)
		status   func(*corev1.NodeStatus)
		selector bool // place by nodeSelector zone=d rather than nodeName
		want     string
	}{
		"cordoned":             {change: func(n *corev1.Node) { n.Spec.Unschedulable = true }, want: "node node-d is cordoned (spec.unschedulable)"},
		"cordoned by selector": {change: func(n *corev1.Node) { n.Spec.Unschedulable = true }, selector: true, want: "no node on nodes matching zone=d takes new work: node node-d is cordoned"},
		"NoSchedule taint":     {change: taint("bashtask.dev/test-untolerated", corev1.TaintEffectNoSchedule), want: "taint bashtask.dev/test-untolerated=x:NoSchedule"},
		"NoExecute taint":      {change: taint("bashtask.dev/test-untolerated", corev1.TaintEffectNoExecute), want: "taint bashtask.dev/test-untolerated=x:NoExecute"},
		"tolerated key, NoExecute effect": {
			change: taint(toleratedTaint, corev1.TaintEffectNoExecute), want: "taint " + toleratedTaint + "=x:NoExecute",
		},
		"Ready False":        {status: setReady(corev1.ConditionFalse, "KubeletNotReady"), want: "node node-d is not Ready (Ready=False: KubeletNotReady)"},
		"Ready Unknown":      {status: setReady(corev1.ConditionUnknown, "NodeStatusUnknown"), want: "node node-d is not Ready (Ready=Unknown: NodeStatusUnknown)"},
		"no Ready condition": {status: setReady("", ""), want: "node node-d is not Ready (it reports no Ready condition)"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			editNode(t, stateNode, tc.change, tc.status)
			defer restoreNode(t, stateNode)
			bt := newTask(ns, fmt.Sprintf("held-%d", i), `echo "$BASHTASK_NODE"`, func(bt *v1.BashTask) {
				if tc.selector {
					bt.Spec.NodeSelector = map[string]string{"zone": "d"}
				} else {
					bt.Spec.NodeName = ptr.To(stateNode)
				}
			})
			create(t, bt)
			waitUnschedulable(t, bt, tc.want)

			// kubectl uncordon, the taint removed, the node Ready again.
			restoreNode(t, stateNode)
			got := waitTerminal(t, bt)
			if ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded || ptr.Deref(got.Status.NodeName, "") != stateNode {
				t.Errorf("after the node took work again: %s", dump.OneLine(got.Status))
			}
		})
	}
}

// Taints the agent's configured tolerations tolerate, and
// PreferNoSchedule taints, keep nothing off the node.
func TestNodeTaintsThatAllowTasks(t *testing.T) {
	ns := newNamespace(t)
	t.Cleanup(func() { restoreNode(t, stateNode) })
	tests := map[string]func(*corev1.Node){
		"tolerated NoSchedule":         taint(toleratedTaint, corev1.TaintEffectNoSchedule),
		"untolerated PreferNoSchedule": taint("bashtask.dev/test-untolerated", corev1.TaintEffectPreferNoSchedule),
	}
	i := 0
	for name, change := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			editNode(t, stateNode, change, nil)
			defer restoreNode(t, stateNode)
			bt := newTask(ns, fmt.Sprintf("allowed-%d", i), "true", func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To(stateNode) })
			create(t, bt)
			got := waitTerminal(t, bt)
			if ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded || ptr.Deref(got.Status.NodeName, "") != stateNode {
				t.Errorf("on a node with a taint that allows it: %s", dump.OneLine(got.Status))
			}
		})
	}
}

// A task without nodeName or nodeSelector goes to another node while one
// is cordoned.
func TestCordonedNodeSkipped(t *testing.T) {
	ns := newNamespace(t)
	t.Cleanup(func() { restoreNode(t, stateNode) })
	editNode(t, stateNode, func(n *corev1.Node) { n.Spec.Unschedulable = true }, nil)
	// A task pinned there shows the controller's cache has the cordon.
	pinned := newTask(ns, "pinned", "true", func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To(stateNode) })
	create(t, pinned)
	waitUnschedulable(t, pinned, "cordoned")
	for i := range 8 {
		bt := newTask(ns, fmt.Sprintf("anywhere-%d", i), "true")
		create(t, bt)
		got := waitTerminal(t, bt)
		if node := ptr.Deref(got.Status.NodeName, ""); node == stateNode || ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded {
			t.Fatalf("a task placed while %s is cordoned: %s", stateNode, dump.OneLine(got.Status))
		}
	}
}

// A task that runs when its node is cordoned goes on and finishes there.
func TestRunningTaskOutlivesCordon(t *testing.T) {
	ns := newNamespace(t)
	t.Cleanup(func() { restoreNode(t, stateNode) })
	release := filepath.Join(t.TempDir(), "release")
	running := newTask(ns, "running", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; echo finished", release), func(bt *v1.BashTask) {
		bt.Spec.NodeName = ptr.To(stateNode)
	})
	create(t, running)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		g.Expect(get(g, running).Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
	}).WithTimeout(waitLong).Should(Succeed())

	editNode(t, stateNode, func(n *corev1.Node) { n.Spec.Unschedulable = true }, nil)
	// Once a new task waits for the node, the controller has seen the
	// cordon while the first one runs.
	waiting := newTask(ns, "waiting", "true", func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To(stateNode) })
	create(t, waiting)
	waitUnschedulable(t, waiting, "cordoned")
	g.Expect(get(g, running).Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)), "the running task was touched by the cordon")

	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := waitTerminal(t, running)
	if ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded || got.Status.Stdout == nil || ptr.Deref(got.Status.Stdout.Tail, "") != "finished\n" {
		t.Errorf("the task running on the cordoned node: %s", dump.OneLine(got.Status))
	}
	g.Expect(get(g, waiting).Status.NodeName).To(BeNil(), "the waiting task was dispatched to the cordoned node")
}
