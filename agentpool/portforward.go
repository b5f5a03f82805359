package agentpool

import (
	"context"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// PortForwardClient returns a client of node's PortForward service
// (api/agent/v1/portforward.proto, docs/portforward.md) on the same
// mutual-TLS connection as Client's, or an error wrapping
// ErrAgentUnavailable when no ready endpoint names the node. The output
// API's bashworkspaces/portforward opens one Forward stream on it per
// forwarded connection.
func (a *AgentReaders) PortForwardClient(ctx context.Context, node string) (agentv1.PortForwardClient, error) {
	cc, err := a.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	return agentv1.NewPortForwardClient(cc), nil
}
