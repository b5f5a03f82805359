package agentpool

import (
	"context"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// TerminalClient returns a client of the Terminal service of node's agent
// (api/agent/v1/terminal.proto), on the connection Client uses, or an
// error wrapping ErrAgentUnavailable when no ready endpoint names the
// node. The output API's bashtasks/attach writes a terminal's input and
// window sizes through it.
func (a *AgentReaders) TerminalClient(ctx context.Context, node string) (agentv1.TerminalClient, error) {
	cc, err := a.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	return agentv1.NewTerminalClient(cc), nil
}
