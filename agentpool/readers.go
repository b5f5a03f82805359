package agentpool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// AgentReaders hands out agent clients for reads (ReadOutput) on every
// controller replica, not only the leader whose AgentRegistry holds the
// Watch streams: the output API is served by all of them. It finds a
// node's agent in the agents' EndpointSlices (the manager's cache, which
// every replica runs) and keeps one mTLS connection per agent address,
// with the same client certificate as the registry, so the agents see the
// controller's identity and nothing else.
type AgentReaders struct {
	reader                    client.Reader
	namespace, service, pname string
	tls                       *tls.Config

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by host:port
}

// NewAgentReaders returns readers that find agents through reader (the
// EndpointSlices of the Service namespace/service, port portName; empty
// takes the first port) and dial them with tlsCfg. tlsCfg is required.
func NewAgentReaders(reader client.Reader, namespace, service, portName string, tlsCfg *tls.Config) (*AgentReaders, error) {
	if tlsCfg == nil {
		return nil, errors.New("agent readers: a TLS client configuration is required")
	}
	return &AgentReaders{reader: reader, namespace: namespace, service: service, pname: portName, tls: tlsCfg,
		conns: map[string]*grpc.ClientConn{}}, nil
}

// Client returns a client for node's agent, or an error wrapping
// ErrAgentUnavailable when no ready endpoint names the node.
func (a *AgentReaders) Client(ctx context.Context, node string) (agentv1.ExecutorClient, error) {
	cc, err := a.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	return agentv1.NewExecutorClient(cc), nil
}

// conn returns the connection to node's agent, dialing it the first
// time, or an error wrapping ErrAgentUnavailable when no ready endpoint
// names the node.
func (a *AgentReaders) conn(ctx context.Context, node string) (*grpc.ClientConn, error) {
	addrs, err := agentAddresses(ctx, a.reader, a.namespace, a.service, a.pname)
	if err != nil {
		return nil, err
	}
	addr, ok := addrs[node]
	if !ok {
		return nil, fmt.Errorf("node %q: %w", node, ErrAgentUnavailable)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if cc := a.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := dial(addr, a.tls)
	if err != nil {
		return nil, fmt.Errorf("creating a gRPC client for %s: %w", addr, err)
	}
	a.conns[addr] = cc
	return cc, nil
}

// Close closes every connection.
func (a *AgentReaders) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for addr, cc := range a.conns {
		_ = cc.Close()
		delete(a.conns, addr)
	}
}
