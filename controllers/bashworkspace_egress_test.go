package controllers

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// spec.egress reaches the agent with its default filled in: Deny with
// allow rules, else Allow, unless set.
func TestEgressPolicySpec(t *testing.T) {
	rule := func(d string, ports ...int32) bashtaskv1alpha1.EgressRule {
		return bashtaskv1alpha1.EgressRule{Domain: d, Ports: ports}
	}
	tests := map[string]struct {
		in   *bashtaskv1alpha1.EgressPolicy
		want *agentv1.EgressPolicy
	}{
		"none": {},
		"allow only": {
			in:   &bashtaskv1alpha1.EgressPolicy{Allow: []bashtaskv1alpha1.EgressRule{rule("pypi.org"), rule("*.github.com", 22, 443)}},
			want: &agentv1.EgressPolicy{DefaultDeny: true, Allow: []*agentv1.EgressRule{{Domain: "pypi.org"}, {Domain: "*.github.com", Ports: []uint32{22, 443}}}},
		},
		"deny only": {
			in:   &bashtaskv1alpha1.EgressPolicy{Deny: []bashtaskv1alpha1.EgressRule{rule("evil.example")}},
			want: &agentv1.EgressPolicy{Deny: []*agentv1.EgressRule{{Domain: "evil.example"}}},
		},
		"default deny, no rules": {
			in:   &bashtaskv1alpha1.EgressPolicy{Default: ptr.To(bashtaskv1alpha1.EgressDefaultDeny)},
			want: &agentv1.EgressPolicy{DefaultDeny: true},
		},
		"default allow with allow rules": {
			in:   &bashtaskv1alpha1.EgressPolicy{Default: ptr.To(bashtaskv1alpha1.EgressDefaultAllow), Allow: []bashtaskv1alpha1.EgressRule{rule("a.example")}},
			want: &agentv1.EgressPolicy{Allow: []*agentv1.EgressRule{{Domain: "a.example"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ws := &bashtaskv1alpha1.BashWorkspace{Spec: bashtaskv1alpha1.BashWorkspaceSpec{Egress: tc.in}}
			if diff := cmp.Diff(tc.want, workspaceSpec(ws).GetEgress(), protocmp.Transform()); diff != "" {
				t.Errorf("egress (-want +got):\n%s", diff)
			}
		})
	}
}

// The EgressPolicy condition names the generation the agent enforces and
// goes with spec.egress; refusals the agent reports become one event per
// status read, naming each new name once.
func TestEgressConditionAndEvents(t *testing.T) {
	ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{UID: "u1", Generation: 3},
		Spec: bashtaskv1alpha1.BashWorkspaceSpec{Egress: &bashtaskv1alpha1.EgressPolicy{Allow: []bashtaskv1alpha1.EgressRule{{Domain: "pypi.org"}}}}}
	setEgressCondition(ws)
	c := meta.FindStatusCondition(ws.Status.Conditions, bashtaskv1alpha1.ConditionEgressPolicy)
	if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 3 || !strings.Contains(c.Message, "allows only the names of 1 allow rules") {
		t.Fatalf("condition %+v", c)
	}
	ws.Spec.Egress = nil
	setEgressCondition(ws)
	if c := meta.FindStatusCondition(ws.Status.Conditions, bashtaskv1alpha1.ConditionEgressPolicy); c != nil {
		t.Errorf("condition %+v without spec.egress", c)
	}

	r := &BashWorkspaceReconciler{refused: map[types.UID]map[string]int64{}}
	// pass reads the refusals in a pass whose events are sent, or not
	// (its status write failed).
	pass := func(send bool, refusals ...*agentv1.EgressRefusal) []workspaceEvent {
		p := &workspacePass{}
		r.egressRefusalEvents(ws, &agentv1.WorkspaceStatus{EgressRefusals: refusals}, p)
		if send {
			p.sent()
		}
		return p.events
	}
	read := func(refusals ...*agentv1.EgressRefusal) []workspaceEvent { return pass(true, refusals...) }
	if ev := pass(false, &agentv1.EgressRefusal{Name: "evil.example", Count: 2}); len(ev) != 1 {
		t.Errorf("a pass whose status write fails: %+v", ev)
	}
	if ev := read(&agentv1.EgressRefusal{Name: "evil.example", Count: 2}); len(ev) != 1 || ev[0].reason != ReasonEgressRefused || !strings.Contains(ev[0].note, "evil.example (2 times)") {
		t.Errorf("first read after a pass that sent nothing: %+v, want the refusals told", ev)
	}
	if ev := read(&agentv1.EgressRefusal{Name: "evil.example", Count: 2}); len(ev) != 0 {
		t.Errorf("the same refusals again: %+v, want no event", ev)
	}
	ev := read(&agentv1.EgressRefusal{Name: "evil.example", Count: 3}, &agentv1.EgressRefusal{Name: "other.example", Count: 1})
	if len(ev) != 1 || !strings.Contains(ev[0].note, "evil.example (1 time), other.example (1 time)") {
		t.Errorf("new refusals: %+v", ev)
	}
}
