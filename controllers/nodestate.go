package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// nodeUnschedulable says why no new task or workspace goes to node n, or
// "" when n takes them. The rules are the scheduler's, applied to the
// agent's pods as the user configured them (tolerations, from
// --agent-tolerations), not as the DaemonSet controller runs them: a
// DaemonSet's pods tolerate node.kubernetes.io/unschedulable, not-ready,
// unreachable and the pressure taints automatically, which is why an agent
// keeps running on a cordoned or failing node, and none of those may send
// new work there.
//
//   - spec.unschedulable (kubectl cordon): always refused, whatever the
//     tolerations; the agent's automatic toleration of the cordon taint
//     is what keeps it there, not a wish for new work.
//   - the Ready condition not True (False, Unknown or absent, as the node
//     lifecycle controller treats a node that never reported): refused.
//   - a taint with effect NoSchedule or NoExecute that no toleration in
//     tolerations tolerates (v1.Toleration.ToleratesTaint, the matcher the
//     scheduler and kubelet use): refused. PreferNoSchedule is a
//     preference and is not honoured here.
func nodeUnschedulable(n *corev1.Node, tolerations []corev1.Toleration) string {
	if n.Spec.Unschedulable {
		return fmt.Sprintf("node %s is cordoned (spec.unschedulable)", n.Name)
	}
	if m := nodeNotReady(n); m != "" {
		return m
	}
	for i := range n.Spec.Taints {
		t := &n.Spec.Taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !tolerates(tolerations, t) {
			return fmt.Sprintf("node %s has the taint %s, which the agent's tolerations (--agent-tolerations) do not tolerate", n.Name, t.ToString())
		}
	}
	return ""
}

// nodeNotReady says why node n does not count as Ready, or "" when its
// Ready condition is True.
func nodeNotReady(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			return ""
		}
		why := ""
		if c.Reason != "" {
			why = ": " + c.Reason
		}
		return fmt.Sprintf("node %s is not Ready (Ready=%s%s)", n.Name, c.Status, why)
	}
	return fmt.Sprintf("node %s is not Ready (it reports no Ready condition)", n.Name)
}

func tolerates(tolerations []corev1.Toleration, t *corev1.Taint) bool {
	for i := range tolerations {
		// Comparison operators (Gt, Lt) are matched as the scheduler
		// matches them where the API server accepted them in the
		// DaemonSet's pods; ParseAgentTolerations checks their values.
		if tolerations[i].ToleratesTaint(klog.Background(), t, true) {
			return true
		}
	}
	return false
}

// ParseAgentTolerations parses --agent-tolerations: a JSON array of
// core/v1 Tolerations, the agent DaemonSet's pod tolerations as the user
// configured them (the chart renders the flag from agent.tolerations).
// Empty input means none. The error names the flag, the entry and the
// field, for unknown fields, an operator or effect Kubernetes does not
// define, an empty key without operator Exists, or a toleration value with
// operator Exists.
func ParseAgentTolerations(s string) ([]corev1.Toleration, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var out []corev1.Toleration
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("--agent-tolerations: not a JSON array of tolerations: %w", err)
	}
	if dec.More() {
		return nil, errors.New("--agent-tolerations: text after the JSON array")
	}
	var errs []error
	for i, t := range out {
		field := fmt.Sprintf("--agent-tolerations[%d]", i)
		switch t.Operator {
		case "", corev1.TolerationOpEqual, corev1.TolerationOpExists, corev1.TolerationOpLt, corev1.TolerationOpGt:
		default:
			errs = append(errs, fmt.Errorf("%s.operator: %q is none of Equal, Exists, Lt, Gt", field, t.Operator))
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, fmt.Errorf("%s.effect: %q is none of NoSchedule, PreferNoSchedule, NoExecute", field, t.Effect))
		}
		if t.Key == "" && t.Operator != corev1.TolerationOpExists {
			errs = append(errs, fmt.Errorf("%s.key: an empty key needs operator Exists", field))
		}
		if t.Operator == corev1.TolerationOpExists && t.Value != "" {
			errs = append(errs, fmt.Errorf("%s.value: must be empty with operator Exists", field))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// nodeSchedulingChanged passes the Node updates that change what
// nodeUnschedulable or a nodeSelector decide: spec.unschedulable, the
// taints, the Ready condition's status and the labels. Heartbeat-only
// status writes pass nothing, and neither do creations: the cache's first
// sync creates every Node, and each would list every task; a task waiting
// for a node that joins finds it at its next retry.
func nodeSchedulingChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok1 || !ok2 {
				return false
			}
			return o.Spec.Unschedulable != n.Spec.Unschedulable ||
				!equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
				nodeNotReady(o) != nodeNotReady(n) ||
				!equality.Semantic.DeepEqual(o.Labels, n.Labels)
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// tasksWaitingForNode maps a Node change to the tasks that wait for a
// node (Scheduled=False with reason NodeUnschedulable or NoAgent), so
// that an uncordon or a cleared taint dispatches them at once rather
// than at their next retry.
func (r *BashTaskReconciler) tasksWaitingForNode(ctx context.Context, _ client.Object) []reconcile.Request {
	var list bashtaskv1alpha1.BashTaskList
	// Read only, never modified: no copy of every task per Node change.
	if err := r.client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		t := &list.Items[i]
		if isDispatched(t) || isTerminal(t) {
			continue
		}
		if reason := scheduledReason(t); reason == ReasonNodeUnschedulable || reason == ReasonNoAgent {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: t.Namespace, Name: t.Name}})
		}
	}
	return reqs
}

// scheduledReason is the reason of the task's Scheduled condition, "" when
// it has none.
func scheduledReason(bt *bashtaskv1alpha1.BashTask) string {
	if c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionScheduled); c != nil {
		return c.Reason
	}
	return ""
}
