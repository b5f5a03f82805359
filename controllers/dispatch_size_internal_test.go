package controllers

import (
	"strconv"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

func TestStartSizeError(t *testing.T) {
	spec := &agentv1.TaskSpec{
		Command:   "cat",
		Env:       []*agentv1.EnvVar{{Name: "SMALL", Value: "x"}, {Name: "LARGE", Value: strings.Repeat("l", 3000)}},
		Stdin:     &agentv1.Stdin{Data: make([]byte, 50000)},
		Resources: &agentv1.Resources{EphemeralStorageBytes: 2 << 30},
	}
	envBytes := agentv1.ArgEnvBytes(spec, "/bin/bash")
	tests := map[string]struct {
		agent agentpool.AgentState
		want  []string // substrings; none for a request that fits
	}{
		"no limits reported": {agent: agentpool.AgentState{Node: "n"}},
		"fits":               {agent: agentpool.AgentState{Node: "n", ArgEnvLimit: 1 << 20, MaxRequestBytes: 1 << 20, DiskCap: 2 << 30}},
		"working directory over the disk cap": {
			agent: agentpool.AgentState{Node: "n", DiskCap: 1 << 30},
			want:  []string{"spec.resources.ephemeralStorage of 2147483648 bytes is over the cap of 1073741824 bytes of the agent on node n"},
		},
		"environment over ARG_MAX": {
			agent: agentpool.AgentState{Node: "n", ArgEnvLimit: 2000, MaxRequestBytes: 1 << 20},
			want:  []string{"over the limit of 2000 bytes the agent on node n accepts", "ARG_MAX", "LARGE (3006 bytes), SMALL (7 bytes)"},
		},
		"stdin over the request limit": {
			agent: agentpool.AgentState{Node: "n", ArgEnvLimit: 1 << 20, MaxRequestBytes: 40000},
			want:  []string{"over the limit of 40000 bytes per request of the agent on node n", "stdin 50000 bytes", "environment " + strconv.FormatInt(envBytes, 10) + " bytes"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := startSizeError(spec, &tc.agent)
			if len(tc.want) == 0 && got != "" {
				t.Errorf("refused: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("message %q lacks %q", got, w)
				}
			}
		})
	}
}
