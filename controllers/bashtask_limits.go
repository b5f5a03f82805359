package controllers

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Reasons of the LimitsEnforced condition and its event.
const (
	// ReasonLimitsEnforced: the node enforces every limit of the task.
	ReasonLimitsEnforced = "Enforced"
	// ReasonLimitsNotEnforced: the node does not enforce some; also the
	// reason of the Warning event that says so.
	ReasonLimitsNotEnforced = "NotEnforced"
)

// agentLimitNames maps the agents' names of limits
// (Readiness.enforced_limits, TaskStatus.limits_not_enforced) to the
// fields of spec.resources.
var agentLimitNames = map[string]bashtaskv1alpha1.ResourceLimitName{
	"memory":            bashtaskv1alpha1.LimitMemory,
	"cpu":               bashtaskv1alpha1.LimitCPU,
	"pids":              bashtaskv1alpha1.LimitPIDs,
	"ephemeral-storage": bashtaskv1alpha1.LimitEphemeralStorage,
}

// requestedLimits names the limits bt's spec.resources asks for.
func requestedLimits(bt *bashtaskv1alpha1.BashTask) []bashtaskv1alpha1.ResourceLimitName {
	res := bt.Spec.Resources
	if res == nil {
		return nil
	}
	var out []bashtaskv1alpha1.ResourceLimitName
	for _, l := range []struct {
		name bashtaskv1alpha1.ResourceLimitName
		set  bool
	}{
		{bashtaskv1alpha1.LimitMemory, res.Memory != nil}, {bashtaskv1alpha1.LimitCPU, res.CPU != nil},
		{bashtaskv1alpha1.LimitPIDs, res.PIDs != nil}, {bashtaskv1alpha1.LimitEphemeralStorage, res.EphemeralStorage != nil},
	} {
		if l.set {
			out = append(out, l.name)
		}
	}
	return out
}

// notEnforcedOn names the limits bt asks for that agent a's node does not
// enforce, as its readiness reports them (an agent that reports none
// enforces none); ephemeralStorage always for a working directory the spec
// names, which is not a file system of its own.
func notEnforcedOn(bt *bashtaskv1alpha1.BashTask, a *agentpool.AgentState) []bashtaskv1alpha1.ResourceLimitName {
	enforced := fromAgentLimits(a.EnforcedLimits)
	var out []bashtaskv1alpha1.ResourceLimitName
	for _, l := range requestedLimits(bt) {
		namedDir := l == bashtaskv1alpha1.LimitEphemeralStorage && ptr.Deref(bt.Spec.WorkingDir, "") != ""
		if !slices.Contains(enforced, l) || namedDir {
			out = append(out, l)
		}
	}
	return out
}

// fromAgentLimits converts an agent's names of limits, leaving out any it
// does not know.
func fromAgentLimits(names []string) []bashtaskv1alpha1.ResourceLimitName {
	var out []bashtaskv1alpha1.ResourceLimitName
	for _, n := range names {
		if l, ok := agentLimitNames[n]; ok && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// setLimitsStatus records which limits bt's node does not enforce:
// isolation.limitsNotEnforced, and for a task that asks for limits the
// limitsEnforced summary (false while any is listed) and the
// LimitsEnforced condition naming them.
func setLimitsStatus(bt *bashtaskv1alpha1.BashTask, notEnforced []bashtaskv1alpha1.ResourceLimitName) {
	st := &bt.Status
	if st.Isolation == nil {
		st.Isolation = &bashtaskv1alpha1.IsolationStatus{}
	}
	st.Isolation.LimitsNotEnforced = notEnforced
	if len(requestedLimits(bt)) == 0 {
		return
	}
	st.Isolation.LimitsEnforced = ptr.To(len(notEnforced) == 0)
	if len(notEnforced) == 0 {
		setCondition(bt, bashtaskv1alpha1.ConditionLimitsEnforced, true, ReasonLimitsEnforced,
			"node "+nodeOf(st)+" enforces every limit of spec.resources")
		return
	}
	setCondition(bt, bashtaskv1alpha1.ConditionLimitsEnforced, false, ReasonLimitsNotEnforced, limitsMessage(nodeOf(st), notEnforced))
}

// limitsMessage says which limits node does not enforce.
func limitsMessage(node string, notEnforced []bashtaskv1alpha1.ResourceLimitName) string {
	names := make([]string, len(notEnforced))
	for i, l := range notEnforced {
		names[i] = "spec.resources." + string(l)
	}
	return fmt.Sprintf("node %s does not enforce %s: the task runs without it, unless the agent refuses such tasks (--unenforced-limits=refuse)", node, strings.Join(names, ", "))
}

// limitsEvents is the Warning event (of action, "Dispatch" or "Start") a
// pass owes when the LimitsEnforced condition turned False, or names other
// limits, since old: one per change, not one per pass.
func limitsEvents(old *bashtaskv1alpha1.BashTaskStatus, bt *bashtaskv1alpha1.BashTask, action string) []taskEvent {
	if !conditionChanged(old, bt, bashtaskv1alpha1.ConditionLimitsEnforced) {
		return nil
	}
	c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionLimitsEnforced)
	if c == nil || c.Reason != ReasonLimitsNotEnforced {
		return nil
	}
	return []taskEvent{{corev1.EventTypeWarning, ReasonLimitsNotEnforced, action, c.Message}}
}

// chooseEnforcing is chooseAgent preferring agents whose node enforces
// every limit p asks for (p.notEnforced): they are chosen among first, and
// the other candidates only when none of them fits.
func chooseEnforcing(p placementRequest, candidates []agentpool.AgentState, unschedulable map[string]string) placement {
	if p.notEnforced != nil {
		enforcing := slices.DeleteFunc(slices.Clone(candidates), func(a agentpool.AgentState) bool { return len(p.notEnforced(&a)) > 0 })
		if len(enforcing) > 0 && len(enforcing) < len(candidates) {
			if pl := chooseAgent(p, enforcing, unschedulable); pl.agent != nil {
				return pl
			}
		}
	}
	return chooseAgent(p, candidates, unschedulable)
}
