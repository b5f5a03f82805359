package controllers

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// A task is placed only on an agent that offers what it asks for.
func TestMissingCapability(t *testing.T) {
	tenant := agentpool.AgentState{Isolation: "tenant", TaskNetwork: "Node", Capabilities: []string{"namespaces", "netns", "seccomp"}}
	tenantNoNet := agentpool.AgentState{Isolation: "tenant", TaskNetwork: "Node", Capabilities: []string{"namespaces", "seccomp"}}
	process := agentpool.AgentState{Isolation: "process", TaskNetwork: "Node"}
	noneDefault := agentpool.AgentState{Isolation: "tenant", TaskNetwork: "None", Capabilities: []string{"namespaces", "netns"}}
	egress := agentpool.AgentState{Isolation: "tenant", TaskNetwork: "Egress", Capabilities: []string{"namespaces", "netns", "egress"}}
	tests := map[string]struct {
		network *bashtaskv1alpha1.TaskNetwork
		agent   agentpool.AgentState
		want    string // a substring of the message; empty: placeable
	}{
		"unset on process":           {agent: process},
		"unset on a none default":    {agent: noneDefault},
		"None on tenant":             {network: ptr.To(bashtaskv1alpha1.NetworkNone), agent: tenant},
		"None on process":            {network: ptr.To(bashtaskv1alpha1.NetworkNone), agent: process, want: "tenant isolation level with the netns capability"},
		"None on tenant without net": {network: ptr.To(bashtaskv1alpha1.NetworkNone), agent: tenantNoNet, want: "netns"},
		"Node on a none default":     {network: ptr.To(bashtaskv1alpha1.NetworkNode), agent: noneDefault, want: "--task-network is node"},
		"Node on process":            {network: ptr.To(bashtaskv1alpha1.NetworkNode), agent: process},
		"Egress on tenant":           {network: ptr.To(bashtaskv1alpha1.NetworkEgress), agent: egress},
		"Egress without egress":      {network: ptr.To(bashtaskv1alpha1.NetworkEgress), agent: tenant, want: "tenant isolation level with the egress capability"},
		"Egress on process":          {network: ptr.To(bashtaskv1alpha1.NetworkEgress), agent: process, want: "egress capability"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := missingCapability(ptr.Deref(tc.network, ""), &tc.agent)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("missingCapability = %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// A network outside an agent's --allowed-networks is named with the field,
// the value and the list; an agent that reports no list refuses nothing.
func TestNetworkNotAllowed(t *testing.T) {
	tenant := agentpool.AgentState{Node: "n1", Isolation: "tenant", AllowedNetworks: []string{"Egress", "None"}}
	old := agentpool.AgentState{Node: "n2", Isolation: "tenant"}
	tests := map[string]struct {
		network *bashtaskv1alpha1.TaskNetwork
		agent   agentpool.AgentState
		want    string
	}{
		"unset":              {agent: tenant},
		"Egress allowed":     {network: ptr.To(bashtaskv1alpha1.NetworkEgress), agent: tenant},
		"Node refused":       {network: ptr.To(bashtaskv1alpha1.NetworkNode), agent: tenant, want: "spec.network Node is not allowed on node n1: its agent's --allowed-networks are Egress, None"},
		"Node on an old one": {network: ptr.To(bashtaskv1alpha1.NetworkNode), agent: old},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := networkNotAllowed(ptr.Deref(tc.network, ""), &tc.agent); got != tc.want {
				t.Errorf("networkNotAllowed = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestApplyTaskIsolation(t *testing.T) {
	uid := uint32(2000007)
	iso := &bashtaskv1alpha1.IsolationStatus{}
	applyTaskIsolation(iso, &agentv1.TaskIsolation{
		Level: "tenant", User: &uid, Namespaces: []string{"mnt", "pid", "ipc", "uts", "net"},
		LandlockAbi: 6, Seccomp: true, Network: "None", PidsLimit: "RLIMIT_NPROC",
	})
	want := &bashtaskv1alpha1.IsolationStatus{
		Level: ptr.To(bashtaskv1alpha1.IsolationLevelTenant), User: ptr.To[int64](2000007),
		Namespaces:  []string{"mnt", "pid", "ipc", "uts", "net"},
		LandlockABI: ptr.To[int32](6), Seccomp: ptr.To(true),
		Network: ptr.To(bashtaskv1alpha1.NetworkNone), ProcessLimit: ptr.To("RLIMIT_NPROC"),
	}
	if diff := cmp.Diff(want, iso); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
