package agentpool

import (
	"crypto/tls"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// The one dial policy for every connection the controller makes to an
// agent, the registry's (Watch, Start, Cancel, workspaces) and the
// readers' (ReadOutput, WriteStdin for the output API) alike.
const (
	// keepaliveTime is the interval of the client's HTTP/2 pings on an idle
	// connection. With keepaliveTimeout it finds a dead or stopped peer
	// behind a silent stream within 15 s, so that --agent-lost-after counts
	// from about then. The agent's enforcement policy permits pings every
	// 10 s (cmd/bashtask-agent, serve.go: MinTime), so this is the shortest interval it
	// accepts without closing the connection with ENHANCE_YOUR_CALM.
	keepaliveTime = 10 * time.Second
	// keepaliveTimeout is how long a ping may stay unanswered.
	keepaliveTimeout = 5 * time.Second
	// maxRecvBytes is the largest reply accepted: an output chunk is at
	// most 1 MiB of data (agent.OutputChunkBytes), a task status well under
	// it; 4 MiB leaves room for the framing and gRPC's own default.
	maxRecvBytes = 4 << 20
)

// dial returns a client connection to addr (host:port) with mutual TLS from
// tlsCfg (cloned: grpc sets the server name on its copy) and the policy
// above. The connection is lazy: nothing is sent before the first call.
func dial(addr string, tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg.Clone())),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvBytes)),
	)
}
