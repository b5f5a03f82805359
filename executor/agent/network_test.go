package agent

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// A task asking for a network outside --allowed-networks ends StartFailed
// with InvalidSpec naming the field, the value and the allowed list, before
// anything starts; the readiness info lists the allowed networks.
func TestAgentRefusesNetworkNotAllowed(t *testing.T) {
	for name, tc := range map[string]struct {
		allowed     []executor.Network
		taskNetwork executor.Network
		ask         string
		want        string
		wantNames   []string
	}{
		"Node where egress and none are allowed": {
			allowed: []executor.Network{executor.NetworkEgress, executor.NetworkNone}, taskNetwork: executor.NetworkNone, ask: "Node",
			want:      "invalid task spec: spec.network Node is not allowed on this agent (--allowed-networks: Egress, None)",
			wantNames: []string{"Egress", "None"},
		},
		"Egress where only node is allowed": {
			allowed: []executor.Network{executor.NetworkNode}, ask: "Egress",
			want:      "invalid task spec: spec.network Egress is not allowed on this agent (--allowed-networks: Node)",
			wantNames: []string{"Node"},
		},
		"unknown network": {
			ask:  "Host",
			want: `invalid task spec: spec.network "Host" is not Node, None or Egress`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, func(c *Config) { c.AllowedNetworks, c.TaskNetwork = tc.allowed, tc.taskNetwork })
			info, _ := r.watch()
			if d := cmp.Diff(tc.wantNames, info.GetReadiness().GetAllowedNetworks()); d != "" {
				t.Errorf("readiness allowed networks (-want +got):\n%s", d)
			}
			spec := taskSpec("uid-net", "echo ran")
			spec.Network = tc.ask
			resp, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			st := resp.GetStatus()
			if st.GetReason() != string(executor.ReasonStartFailed) || st.GetMessage() != tc.want {
				t.Errorf("status %s %q, want StartFailed %q", st.GetReason(), st.GetMessage(), tc.want)
			}
			if strings.Contains(st.GetStdout().GetTail(), "ran") {
				t.Error("the command ran")
			}
		})
	}
}
