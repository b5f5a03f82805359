package controllers

import (
	"fmt"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ReasonEgressRefused is the reason of the Warning event a BashWorkspace
// gets when its egress policy refused a name (docs/egress.md).
const ReasonEgressRefused = "EgressRefused"

// egressPolicySpec is the agent's form of spec.egress; nil for none. An
// unset default is Deny when allow has rules, else Allow.
func egressPolicySpec(p *bashtaskv1alpha1.EgressPolicy) *agentv1.EgressPolicy {
	if p == nil {
		return nil
	}
	out := &agentv1.EgressPolicy{DefaultDeny: len(p.Allow) > 0}
	if p.Default != nil {
		out.DefaultDeny = *p.Default == bashtaskv1alpha1.EgressDefaultDeny
	}
	conv := func(rules []bashtaskv1alpha1.EgressRule) []*agentv1.EgressRule {
		var rs []*agentv1.EgressRule
		for _, r := range rules {
			ar := &agentv1.EgressRule{Domain: r.Domain}
			for _, port := range r.Ports {
				ar.Ports = append(ar.Ports, uint32(port))
			}
			rs = append(rs, ar)
		}
		return rs
	}
	out.Allow, out.Deny = conv(p.Allow), conv(p.Deny)
	return out
}

// setEgressCondition records, after the agent answered an EnsureWorkspace
// of ws's generation, that the policy of that generation is enforced; a
// workspace without spec.egress has no such condition.
func setEgressCondition(ws *bashtaskv1alpha1.BashWorkspace) {
	if ws.Spec.Egress == nil {
		meta.RemoveStatusCondition(&ws.Status.Conditions, bashtaskv1alpha1.ConditionEgressPolicy)
		return
	}
	p := egressPolicySpec(ws.Spec.Egress)
	what := "allows every name but %d denied"
	n := len(p.GetDeny())
	if p.GetDefaultDeny() {
		what, n = "allows only the names of %d allow rules", len(p.GetAllow())
	}
	meta.SetStatusCondition(&ws.Status.Conditions, metav1.Condition{
		Type: bashtaskv1alpha1.ConditionEgressPolicy, Status: metav1.ConditionTrue, ObservedGeneration: ws.Generation,
		Reason:  bashtaskv1alpha1.ReasonEgressPolicyApplied,
		Message: fmt.Sprintf("the agent enforces spec.egress of generation %d: it "+what, ws.Generation, n),
	})
}

// egressRefusalEvents adds a Warning event for each name the agent
// reports refused since the last event of this controller named it (one
// per name and status read, so at most one per name each
// --workspace-refresh-interval). The counts are recorded once the event
// is sent: a pass whose status write failed tells them again.
func (r *BashWorkspaceReconciler) egressRefusalEvents(ws *bashtaskv1alpha1.BashWorkspace, st *agentv1.WorkspaceStatus, p *workspacePass) {
	refusals := st.GetEgressRefusals()
	if len(refusals) == 0 {
		return
	}
	r.refusedMu.Lock()
	seen := maps.Clone(r.refused[ws.UID])
	r.refusedMu.Unlock()
	var names []string
	told := map[string]int64{}
	for _, x := range refusals {
		if x.GetCount() > seen[x.GetName()] {
			names = append(names, fmt.Sprintf("%s (%s)", x.GetName(), timesText(x.GetCount()-seen[x.GetName()])))
			told[x.GetName()] = x.GetCount()
		}
	}
	if len(names) == 0 {
		return
	}
	p.event(corev1.EventTypeWarning, ReasonEgressRefused, "Resolve", "the workspace's egress policy (spec.egress) refused to resolve %s", strings.Join(names, ", "))
	p.afterSend(func() {
		r.refusedMu.Lock()
		defer r.refusedMu.Unlock()
		if r.refused[ws.UID] == nil {
			r.refused[ws.UID] = map[string]int64{}
		}
		maps.Copy(r.refused[ws.UID], told)
	})
}

// forgetRefusals drops what egressRefusalEvents remembers of workspace
// uid.
func (r *BashWorkspaceReconciler) forgetRefusals(uid types.UID) {
	r.refusedMu.Lock()
	delete(r.refused, uid)
	r.refusedMu.Unlock()
}

// timesText is "1 time" or "n times".
func timesText(n int64) string {
	if n == 1 {
		return "1 time"
	}
	return fmt.Sprintf("%d times", n)
}
