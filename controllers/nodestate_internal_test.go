package controllers

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bashtask/bashtask-operator/agentpool"
)

func TestNodeUnschedulable(t *testing.T) {
	ready := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	node := func(mutate func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: ready}}
		if mutate != nil {
			mutate(n)
		}
		return n
	}
	withTaint := func(key, value string, effect corev1.TaintEffect) func(*corev1.Node) {
		return func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: key, Value: value, Effect: effect}} }
	}
	gpu := []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "yes", Effect: corev1.TaintEffectNoSchedule}}
	all := []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	tests := map[string]struct {
		node        *corev1.Node
		tolerations []corev1.Toleration
		want        string // substring; "" means schedulable
	}{
		"ready, untainted": {node: node(nil)},
		"cordoned":         {node: node(func(n *corev1.Node) { n.Spec.Unschedulable = true }), want: "cordoned"},
		"cordoned, everything tolerated": {
			node: node(func(n *corev1.Node) { n.Spec.Unschedulable = true }), tolerations: all, want: "cordoned",
		},
		"Ready False": {node: node(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady"}}
		}), want: "Ready=False: KubeletNotReady"},
		"Ready Unknown": {node: node(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}
		}), want: "Ready=Unknown"},
		"only other conditions": {node: node(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}}
		}), want: "no Ready condition"},
		"no conditions":             {node: node(func(n *corev1.Node) { n.Status.Conditions = nil }), want: "no Ready condition"},
		"NoSchedule untolerated":    {node: node(withTaint("gpu", "yes", corev1.TaintEffectNoSchedule)), want: "taint gpu=yes:NoSchedule"},
		"NoSchedule tolerated":      {node: node(withTaint("gpu", "yes", corev1.TaintEffectNoSchedule)), tolerations: gpu},
		"NoSchedule other value":    {node: node(withTaint("gpu", "no", corev1.TaintEffectNoSchedule)), tolerations: gpu, want: "taint gpu=no:NoSchedule"},
		"NoExecute, NoSchedule tol": {node: node(withTaint("gpu", "yes", corev1.TaintEffectNoExecute)), tolerations: gpu, want: "taint gpu=yes:NoExecute"},
		"NoExecute, all tolerated":  {node: node(withTaint("gpu", "yes", corev1.TaintEffectNoExecute)), tolerations: all},
		"PreferNoSchedule":          {node: node(withTaint("gpu", "yes", corev1.TaintEffectPreferNoSchedule))},
		"the cordon taint is not the cordon": {
			// A DaemonSet's automatic toleration of the cordon taint is not
			// in the configured list; a node tainted by hand is refused.
			node: node(withTaint(corev1.TaintNodeUnschedulable, "", corev1.TaintEffectNoSchedule)), want: "taint " + corev1.TaintNodeUnschedulable + ":NoSchedule",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := nodeUnschedulable(tc.node, tc.tolerations)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("nodeUnschedulable = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseAgentTolerations(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    int    // tolerations parsed
		wantErr string // substring
	}{
		"empty":           {in: ""},
		"empty array":     {in: "[]"},
		"chart rendering": {in: `[{"effect":"NoSchedule","key":"gpu","operator":"Exists"},{"operator":"Exists"}]`, want: 2},
		"not an array":    {in: `{"key":"gpu"}`, wantErr: "not a JSON array"},
		"unknown field":   {in: `[{"kee":"gpu","operator":"Exists"}]`, wantErr: "unknown field"},
		"trailing text":   {in: `[] []`, wantErr: "text after"},
		"bad operator":    {in: `[{"key":"gpu","operator":"Is"}]`, wantErr: `--agent-tolerations[0].operator: "Is"`},
		"bad effect":      {in: `[{"key":"gpu","operator":"Exists","effect":"NoRun"}]`, wantErr: `--agent-tolerations[0].effect: "NoRun"`},
		"empty key Equal": {in: `[{"value":"x"}]`, wantErr: "--agent-tolerations[0].key: an empty key needs operator Exists"},
		"Exists value":    {in: `[{"key":"a","operator":"Exists","value":"x"}]`, wantErr: "--agent-tolerations[0].value"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseAgentTolerations(tc.in)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("error %v", err)
			case len(got) != tc.want:
				t.Errorf("%d tolerations, want %d", len(got), tc.want)
			}
		})
	}
}

// The reason is NodeUnschedulable only when every candidate's node refuses
// new work; otherwise NoAgent, naming the unschedulable nodes.
func TestChooseAgentUnschedulable(t *testing.T) {
	ready := func(node string, running int) agentpool.AgentState {
		return agentpool.AgentState{Node: node, Ready: true, Connected: true, Capacity: 1, Running: running}
	}
	cordoned := func(nodes ...string) map[string]string {
		m := map[string]string{}
		for _, n := range nodes {
			m[n] = "node " + n + " is cordoned (spec.unschedulable)"
		}
		return m
	}
	tests := map[string]struct {
		agents     []agentpool.AgentState
		refused    map[string]string
		wantNode   string
		wantReason string
		wantWhy    string
	}{
		"one of two":        {agents: []agentpool.AgentState{ready("a", 0), ready("b", 0)}, refused: cordoned("a"), wantNode: "b"},
		"all":               {agents: []agentpool.AgentState{ready("a", 0), ready("b", 0)}, refused: cordoned("a", "b"), wantReason: ReasonNodeUnschedulable, wantWhy: "node a is cordoned (spec.unschedulable); node b is cordoned"},
		"the other is full": {agents: []agentpool.AgentState{ready("a", 0), ready("b", 1)}, refused: cordoned("a"), wantReason: ReasonNoAgent, wantWhy: "1 on unschedulable nodes, 0 not ready, 1 at capacity"},
		"many named, then counted": {
			agents:  []agentpool.AgentState{ready("a", 0), ready("b", 0), ready("c", 0), ready("d", 0), ready("e", 0), ready("f", 0), ready("g", 0)},
			refused: cordoned("a", "b", "c", "d", "e", "f", "g"), wantReason: ReasonNodeUnschedulable, wantWhy: "node e is cordoned (spec.unschedulable); and 2 more",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pl := chooseAgent(placementRequest{what: "the task"}, tc.agents, tc.refused)
			a, reason, why, invalid := pl.agent, pl.reason, pl.why, pl.invalid
			if invalid != "" {
				t.Fatalf("invalid = %q", invalid)
			}
			if tc.wantNode != "" {
				if a == nil || a.Node != tc.wantNode {
					t.Errorf("placed on %v (%s), want %s", a, why, tc.wantNode)
				}
				return
			}
			if a != nil || reason != tc.wantReason || !strings.Contains(why, tc.wantWhy) {
				t.Errorf("got %v, %q, %q; want nil, %q, containing %q", a, reason, why, tc.wantReason, tc.wantWhy)
			}
		})
	}
}
