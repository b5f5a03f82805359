package agent

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// A WorkspaceSpec's injection rules reach the executor's policy; a bad
// one is INVALID_ARGUMENT naming egress.inject[i], without the value.
func TestEgressPolicyInjections(t *testing.T) {
	const value = "Bearer s3cret"
	rule := &agentv1.EgressInjection{Domain: "api.example.com", Header: "Authorization", Value: value, ScrubResponses: true}
	p, err := egressPolicy(&agentv1.EgressPolicy{Inject: []*agentv1.EgressInjection{rule}}, executor.NetworkEgress)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Inject) != 1 || p.Inject[0].Value != value || !p.Inject[0].ScrubResponses {
		t.Errorf("converted %v", p.Inject)
	}
	bad := &agentv1.EgressInjection{Domain: "api.example.com", Header: "Bad Header", Value: value}
	_, err = egressPolicy(&agentv1.EgressPolicy{Inject: []*agentv1.EgressInjection{rule, bad}}, executor.NetworkEgress)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "egress.inject[1]") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad header: %v, want INVALID_ARGUMENT naming egress.inject[1] without the value", err)
	}
	denied := &agentv1.EgressInjection{Domain: "api.example.com", Header: "Authorization", Value: value}
	_, err = egressPolicy(&agentv1.EgressPolicy{Deny: []*agentv1.EgressRule{{Domain: "*.example.com"}}, Inject: []*agentv1.EgressInjection{denied}}, executor.NetworkEgress)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no header can be injected") {
		t.Errorf("denied domain: %v", err)
	}
}
