package agent

import (
	"fmt"
	"slices"
	"strings"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// apiNetworks are the API's spellings of the executor's networks
// (spec.network, status.isolation.network).
var apiNetworks = []struct {
	api  string
	exec executor.Network
}{
	{"Node", executor.NetworkNode},
	{"None", executor.NetworkNone},
	{"Egress", executor.NetworkEgress},
}

// apiNetwork is the API's spelling of a network: "Node", "None" or
// "Egress"; the zero value is "Node".
func apiNetwork(n executor.Network) string {
	for _, a := range apiNetworks {
		if a.exec == n {
			return a.api
		}
	}
	return "Node"
}

// execNetwork is the executor's network of an API spelling (any case);
// false for an empty or unknown one.
func execNetwork(api string) (executor.Network, bool) {
	for _, a := range apiNetworks {
		if strings.EqualFold(a.api, api) {
			return a.exec, true
		}
	}
	return "", false
}

// allowedNetworkNames lists Config.AllowedNetworks in the API's spelling,
// nil when every network is allowed.
func (s *Server) allowedNetworkNames() []string {
	var out []string
	for _, n := range s.cfg.AllowedNetworks {
		out = append(out, apiNetwork(n))
	}
	return out
}

// networkError refuses a spec that asks for a network this agent does not
// run: one not in --allowed-networks, or "Node" where --task-network is
// none (a task may ask for less network than the default, never more). The
// error is a StartFailed with InvalidSpec naming the field, the value and
// what is allowed.
func (s *Server) networkError(spec *agentv1.TaskSpec) error {
	name := spec.GetNetwork()
	if name == "" {
		return nil
	}
	n, ok := execNetwork(name)
	switch {
	case !ok:
		return &executor.StartError{Kind: executor.ErrInvalidSpec, Subject: fmt.Sprintf("spec.network %q is not Node, None or Egress", name)}
	case len(s.cfg.AllowedNetworks) > 0 && !slices.Contains(s.cfg.AllowedNetworks, n):
		return &executor.StartError{Kind: executor.ErrInvalidSpec, Subject: fmt.Sprintf("spec.network %s is not allowed on this agent (--allowed-networks: %s)", apiNetwork(n), strings.Join(s.allowedNetworkNames(), ", "))}
	case n == executor.NetworkNode && s.cfg.TaskNetwork == executor.NetworkNone:
		return &executor.StartError{Kind: executor.ErrInvalidSpec, Subject: "spec.network Node: this agent gives tasks no network (--task-network=none)"}
	}
	return nil
}
