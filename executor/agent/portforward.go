package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// portForwardDialTimeout bounds the dial of a forwarded connection: a
// listener on loopback answers at once, one whose backlog is full may not.
const portForwardDialTimeout = 10 * time.Second

// portForwards serves the PortForward protocol
// (api/agent/v1/portforward.proto, docs/portforward.md) for a Server: one
// Forward call per forwarded TCP connection, at most
// agentv1.MaxPortForwardsPerWorkspace open per workspace.
type portForwards struct {
	agentv1.UnimplementedPortForwardServer

	s    *Server
	mu   sync.Mutex
	open map[string]int // workspace UID -> forwarded connections open
}

func newPortForwards(s *Server) *portForwards {
	return &portForwards{s: s, open: map[string]int{}}
}

// Forward implements the Forward RPC.
func (p *portForwards) Forward(stream agentv1.PortForward_ForwardServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	o := first.GetOpen()
	if err := validatePortForwardOpen(o); err != nil {
		return err
	}
	release, err := p.acquire(o.GetWorkspaceUid())
	if err != nil {
		return err
	}
	defer release()
	xw, err := p.workspace(o.GetWorkspaceUid())
	if err != nil {
		return err
	}
	conn, err := dialWorkspace(stream.Context(), xw, o)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := stream.Send(&agentv1.PortForwardResponse{Connected: true}); err != nil {
		return err
	}
	if err := writeForwarded(conn, first); err != nil {
		return err
	}
	go copyFromStream(stream, conn)
	return copyToStream(conn, stream)
}

// validatePortForwardOpen checks the first request's open message.
func validatePortForwardOpen(o *agentv1.PortForwardOpen) error {
	switch {
	case o == nil:
		return status.Error(codes.InvalidArgument, "the first PortForwardRequest must carry open (workspace_uid and port)")
	case !validUID.MatchString(o.GetWorkspaceUid()):
		return status.Errorf(codes.InvalidArgument, "workspace_uid %q: letters, digits, '-', '_' and '.', 1 to 128 bytes", o.GetWorkspaceUid())
	case o.GetPort() < 1 || o.GetPort() > 65535:
		return status.Errorf(codes.InvalidArgument, "port %d: must be 1-65535", o.GetPort())
	}
	return nil
}

// acquire counts one more forwarded connection of workspace uid, refusing
// it past the limit; release gives it back.
func (p *portForwards) acquire(uid string) (release func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[uid] >= agentv1.MaxPortForwardsPerWorkspace {
		return nil, status.Errorf(codes.ResourceExhausted, "workspace %s has %d forwarded connections open, the limit (MaxPortForwardsPerWorkspace): close one first", uid, agentv1.MaxPortForwardsPerWorkspace)
	}
	p.open[uid]++
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.open[uid]--; p.open[uid] <= 0 {
			delete(p.open, uid)
		}
	}, nil
}

// workspace is the executor's hold on workspace uid, ready for a dial.
func (p *portForwards) workspace(uid string) (*executor.Workspace, error) {
	s := p.s
	if s.cfg.Executor.Isolation != executor.IsolationTenant {
		return nil, status.Error(codes.FailedPrecondition, "port-forward needs a workspace with a network namespace of its own, and this agent runs at the process isolation level, which has no workspaces (--isolation=tenant)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.ws.byUID[uid]
	switch {
	case w == nil || w.gone:
		return nil, status.Errorf(codes.NotFound, "workspace %s is not known", uid)
	case w.busy != nil || w.ex == nil:
		return nil, status.Errorf(codes.Unavailable, "workspace %s is being made or deleted", uid)
	}
	return w.ex, nil
}

// dialWorkspace connects to the open message's port on the workspace's
// loopback; the error is the RPC's.
func dialWorkspace(ctx context.Context, xw *executor.Workspace, o *agentv1.PortForwardOpen) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, portForwardDialTimeout)
	defer cancel()
	conn, err := xw.DialLoopback(dctx, int(o.GetPort()))
	switch {
	case err == nil:
		return conn, nil
	case errors.Is(err, executor.ErrNoNetworkNamespace):
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s: port-forward refused: %v", o.GetWorkspaceUid(), err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s: 127.0.0.1:%d: connection refused (nothing listens on port %d in the workspace)", o.GetWorkspaceUid(), o.GetPort(), o.GetPort())
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, status.Errorf(codes.Unavailable, "workspace %s: dialing 127.0.0.1:%d: %v", o.GetWorkspaceUid(), o.GetPort(), err)
}

// writeForwarded writes a request's data to conn, then half-closes it
// when the request says so.
func writeForwarded(conn net.Conn, m *agentv1.PortForwardRequest) error {
	if len(m.GetData()) > agentv1.MaxPortForwardChunkBytes {
		return status.Errorf(codes.InvalidArgument, "data is %d bytes, over the limit of %d per message (MaxPortForwardChunkBytes)", len(m.GetData()), agentv1.MaxPortForwardChunkBytes)
	}
	if len(m.GetData()) > 0 {
		if _, err := conn.Write(m.GetData()); err != nil {
			return err
		}
	}
	if m.GetCloseWrite() {
		return closeWrite(conn)
	}
	return nil
}

// closeWrite shuts down conn's write side: the workspace's side reads EOF.
func closeWrite(conn net.Conn) error {
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// copyFromStream writes the controller's bytes to conn until the
// controller half-closes (close_write or the end of its sending side); a
// broken stream or a bad message closes conn, which ends copyToStream.
func copyFromStream(stream agentv1.PortForward_ForwardServer, conn net.Conn) {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			_ = closeWrite(conn)
			return
		}
		if err != nil || writeForwarded(conn, m) != nil {
			conn.Close()
			return
		}
		if m.GetCloseWrite() {
			return
		}
	}
}

// copyToStream sends what the workspace's side writes until it closes its
// end (nil: the call ends with OK) or the connection breaks.
func copyToStream(conn net.Conn, stream agentv1.PortForward_ForwardServer) error {
	buf := make([]byte, agentv1.MaxPortForwardChunkBytes)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if serr := stream.Send(&agentv1.PortForwardResponse{Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if stream.Context().Err() != nil {
				return status.FromContextError(stream.Context().Err()).Err()
			}
			return status.Errorf(codes.Aborted, "the forwarded connection broke: %v", fmt.Sprint(err))
		}
	}
}
