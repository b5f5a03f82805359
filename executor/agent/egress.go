package agent

import (
	"fmt"
	"reflect"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// Limits of an egress policy (api/v1alpha1 MaxEgressRules and
// MaxEgressPorts), checked again here for callers other than the
// controller.
const (
	maxEgressRules = 64
	maxEgressPorts = 16
)

// egressPolicy converts a WorkspaceSpec's egress policy for a workspace of
// network; nil for none. INVALID_ARGUMENT names the field and the rule.
func egressPolicy(p *agentv1.EgressPolicy, network executor.Network) (*executor.EgressPolicy, error) {
	if p == nil {
		return nil, nil
	}
	if network != executor.NetworkEgress {
		return nil, status.Errorf(codes.InvalidArgument, "spec.egress needs network Egress, the workspace has %s", apiNetwork(network))
	}
	out := &executor.EgressPolicy{DefaultDeny: p.GetDefaultDeny()}
	for _, l := range []struct {
		name  string
		rules []*agentv1.EgressRule
		dst   *[]executor.EgressRule
	}{{"allow", p.GetAllow(), &out.Allow}, {"deny", p.GetDeny(), &out.Deny}} {
		if len(l.rules) > maxEgressRules {
			return nil, status.Errorf(codes.InvalidArgument, "spec.egress.%s has %d rules, at most %d", l.name, len(l.rules), maxEgressRules)
		}
		for i, r := range l.rules {
			rule, err := egressRule(r, fmt.Sprintf("spec.egress.%s[%d]", l.name, i))
			if err != nil {
				return nil, err
			}
			*l.dst = append(*l.dst, rule)
		}
	}
	if len(p.GetInject()) > executor.MaxEgressInjections {
		return nil, status.Errorf(codes.InvalidArgument, "spec.egress.inject has %d rules, at most %d", len(p.GetInject()), executor.MaxEgressInjections)
	}
	out.Inject = execInjections(p.GetInject())
	if err := out.Validate(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "spec.%v", err)
	}
	return out, nil
}

// execInjections converts injection rules; Validate checks them (its
// errors never hold a value).
func execInjections(rules []*agentv1.EgressInjection) []executor.EgressInjection {
	var out []executor.EgressInjection
	for _, r := range rules {
		out = append(out, executor.EgressInjection{Domain: r.GetDomain(), Header: r.GetHeader(), Value: r.GetValue(),
			CABundle: r.GetCaBundle(), ScrubResponses: r.GetScrubResponses()})
	}
	return out
}

// egressRule converts one rule; field names it in errors.
func egressRule(r *agentv1.EgressRule, field string) (executor.EgressRule, error) {
	out := executor.EgressRule{Domain: r.GetDomain()}
	if len(r.GetPorts()) > maxEgressPorts {
		return out, status.Errorf(codes.InvalidArgument, "%s.ports has %d ports, at most %d", field, len(r.GetPorts()), maxEgressPorts)
	}
	for j, p := range r.GetPorts() {
		if p < 1 || p > 65535 {
			return out, status.Errorf(codes.InvalidArgument, "%s.ports[%d] %d is not between 1 and 65535", field, j, p)
		}
		out.Ports = append(out.Ports, uint16(p))
	}
	return out, nil
}

// applyEgress has the executor enforce the workspace's recorded policy.
// The caller holds s.mu or is the only user of w.
func (ws *workspaces) applyEgress(w *workspace) error {
	if w.ex == nil {
		return nil
	}
	if err := w.ex.SetEgressPolicy(w.rec.Egress, ws.egressRefused(w)); err != nil {
		return status.Errorf(codes.Internal, "applying workspace %s's egress policy: %v", w.rec.UID, err)
	}
	return nil
}

// egressRefused counts a refusal of w's resolver and keeps it among the
// workspace's recent refusals (WorkspaceStatus.egress_refusals). It takes
// refusalsMu only, never s.mu: the resolver's shutdown, which waits for
// this, may run under s.mu.
func (ws *workspaces) egressRefused(w *workspace) func(executor.EgressRefusal) {
	s := ws.s
	return func(r executor.EgressRefusal) {
		if s.metrics != nil {
			s.metrics.EgressRefusals.WithLabelValues("dns").Inc()
		}
		ws.refusalsMu.Lock()
		w.refusals = noteRefusal(w.refusals, r.Name, time.Now())
		ws.refusalsMu.Unlock()
	}
}

// maxRecentRefusals bounds the names a workspace's status lists as
// recently refused.
const maxRecentRefusals = 16

// noteRefusal counts name in list, the most recent last; the least
// recent goes when the list is full.
func noteRefusal(list []*agentv1.EgressRefusal, name string, now time.Time) []*agentv1.EgressRefusal {
	for i, r := range list {
		if r.GetName() == name {
			r.Count++
			r.LastUnixMillis = now.UnixMilli()
			return append(append(list[:i:i], list[i+1:]...), r)
		}
	}
	if len(list) >= maxRecentRefusals {
		list = list[1:]
	}
	return append(list, &agentv1.EgressRefusal{Name: name, Count: 1, LastUnixMillis: now.UnixMilli()})
}

// updateEgressLocked makes spec the policy of a workspace the agent
// holds, when it differs from the recorded one or was not applied yet:
// recorded first, so that a restart applies the new one.
func (ws *workspaces) updateEgressLocked(w *workspace, spec *agentv1.EgressPolicy) error {
	pol, err := egressPolicy(spec, w.rec.Network)
	if err != nil {
		return err
	}
	if w.egressApplied && reflect.DeepEqual(pol, w.rec.Egress) {
		return nil
	}
	w.rec.Egress = pol
	if err := ws.files.writeRecord(w.rec, false); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	w.egressApplied = false
	if err := ws.applyEgress(w); err != nil {
		return err
	}
	w.egressApplied = w.ex != nil
	return nil
}

// execEgress converts a task's policy unchecked: the executor's Start
// checks it and fails the task naming the rule. A port over 65535
// becomes 0, which that check refuses, rather than wrapping around.
func execEgress(p *agentv1.EgressPolicy) *executor.EgressPolicy {
	conv := func(rules []*agentv1.EgressRule) []executor.EgressRule {
		var out []executor.EgressRule
		for _, r := range rules {
			er := executor.EgressRule{Domain: r.GetDomain()}
			for _, port := range r.GetPorts() {
				if port > 65535 {
					port = 0
				}
				er.Ports = append(er.Ports, uint16(port))
			}
			out = append(out, er)
		}
		return out
	}
	return &executor.EgressPolicy{DefaultDeny: p.GetDefaultDeny(), Allow: conv(p.GetAllow()), Deny: conv(p.GetDeny()), Inject: execInjections(p.GetInject())}
}
