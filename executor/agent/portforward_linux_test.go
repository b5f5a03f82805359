//go:build linux

package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// echoServer is a task command: a forking TCP server on 127.0.0.1:port
// that answers each line with tag:line, closes a connection after "bye"
// or at its client's EOF, and prints "listening" once it listens.
func echoServer(port int, tag string) string {
	return fmt.Sprintf(`exec perl -MIO::Socket::INET -e '$|=1; $SIG{CHLD}="IGNORE"; $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:%d", Listen => 128, ReuseAddr => 1) or die "listen: $!"; print "listening\n"; while (1) { $c = $s->accept or next; if (fork() == 0) { while (<$c>) { print $c "%s:$_"; last if /^bye/ } close $c; exit 0 } close $c }'`, port, tag)
}

// startListening starts spec and waits until its stdout says listening.
func (r *rig) startListening(spec *agentv1.TaskSpec) {
	r.t.Helper()
	if _, err := r.client.Start(r.t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		r.t.Fatalf("Start %s: %v", spec.GetRef().GetUid(), err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := r.client.Get(r.t.Context(), &agentv1.GetRequest{Uid: spec.GetRef().GetUid()})
		if err != nil {
			r.t.Fatal(err)
		}
		st := resp.GetStatus()
		if strings.Contains(st.GetStdout().GetTail(), "listening") {
			return
		}
		if st.GetState() == agentv1.TaskState_TASK_STATE_FINISHED || time.Now().After(deadline) {
			r.t.Fatalf("server %s did not listen: %s %q %q", spec.GetRef().GetUid(), st.GetReason(), st.GetMessage(), st.GetStderr().GetTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// forward opens a forwarded connection to port of workspace ws and
// returns the stream once the agent said connected, or the call's error.
func forward(t *testing.T, pc agentv1.PortForwardClient, ws string, port int32) (agentv1.PortForward_ForwardClient, error) {
	t.Helper()
	stream, err := pc.Forward(t.Context())
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&agentv1.PortForwardRequest{Open: &agentv1.PortForwardOpen{WorkspaceUid: ws, Port: port}}); err != nil {
		return nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if !m.GetConnected() {
		t.Fatalf("first response %v, want connected", m)
	}
	return stream, nil
}

// exchange sends line and reads until want arrived (or the stream
// broke).
func exchange(stream agentv1.PortForward_ForwardClient, line, want string) error {
	if err := stream.Send(&agentv1.PortForwardRequest{Data: []byte(line)}); err != nil {
		return err
	}
	var got string
	for len(got) < len(want) {
		m, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("after %q: %w", got, err)
		}
		got += string(m.GetData())
	}
	if got != want {
		return fmt.Errorf("got %q, want %q", got, want)
	}
	return nil
}

// The PortForward service reaches 127.0.0.1:PORT inside the workspace's
// network namespace and nothing else: a listener of the workspace is
// reached, many connections at once; the node's loopback and another
// workspace's listener on the asked port are not (connection refused).
// Either side's close ends the other's.
func TestPortForwardReachesTheWorkspaceOnly(t *testing.T) {
	r := newRig(t, tenantLevel(2101200, 2101209))
	wc := r.workspaceClient()
	pc := agentv1.NewPortForwardClient(r.dial(r.ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}))
	ensure(t, wc, "w1", "None", false)
	ensure(t, wc, "w2", "None", false)
	r.startListening(wsTask("srv1", "w1", echoServer(7420, "w1")))
	r.startListening(wsTask("srv2", "w2", echoServer(7422, "w2")))
	node, err := net.Listen("tcp4", "127.0.0.1:7421")
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()

	t.Run("many connections at once", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := range 16 {
			wg.Go(func() {
				s, err := forward(t, pc, "w1", 7420)
				if err == nil {
					err = exchange(s, fmt.Sprintf("hello %d\n", i), fmt.Sprintf("w1:hello %d\n", i))
					_ = s.CloseSend()
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("the server's close ends the call", func(t *testing.T) {
		s, err := forward(t, pc, "w1", 7420)
		if err != nil {
			t.Fatal(err)
		}
		if err := exchange(s, "bye\n", "w1:bye\n"); err != nil {
			t.Fatal(err)
		}
		if m, err := s.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the server closed: %v %v, want the call's end (EOF)", m, err)
		}
	})
	t.Run("the client's close reaches the server", func(t *testing.T) {
		s, err := forward(t, pc, "w1", 7420)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&agentv1.PortForwardRequest{Data: []byte("last\n"), CloseWrite: true}); err != nil {
			t.Fatal(err)
		}
		var got string
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("after %q: %v", got, err)
			}
			got += string(m.GetData())
		}
		if got != "w1:last\n" {
			t.Errorf("got %q before the server closed, want w1:last", got)
		}
	})
	t.Run("not the node's loopback nor another workspace", func(t *testing.T) {
		for _, port := range []int32{7421, 7422} {
			_, err := forward(t, pc, "w1", port)
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "connection refused") {
				t.Errorf("port %d of w1: %v, want FAILED_PRECONDITION connection refused", port, err)
			}
		}
		s, err := forward(t, pc, "w2", 7422)
		if err == nil {
			err = exchange(s, "x\n", "w2:x\n")
		}
		if err != nil {
			t.Errorf("port 7422 of w2: %v", err)
		}
	})
}

// Bad requests are refused naming the problem: a port outside 1-65535, an
// unknown workspace, a workspace without a network namespace of its own,
// and a connection past the per-workspace limit.
func TestPortForwardRefusals(t *testing.T) {
	r := newRig(t, tenantLevel(2101210, 2101219))
	wc := r.workspaceClient()
	pc := agentv1.NewPortForwardClient(r.dial(r.ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}))
	ensure(t, wc, "w1", "None", false)
	ensure(t, wc, "wn", "Node", false)
	r.startListening(wsTask("srv1", "w1", echoServer(7430, "w1")))
	for _, c := range []struct {
		ws   string
		port int32
		code codes.Code
		msg  string
	}{
		{"w1", 0, codes.InvalidArgument, "port 0: must be 1-65535"},
		{"w1", 65536, codes.InvalidArgument, "port 65536: must be 1-65535"},
		{"nope", 7430, codes.NotFound, "workspace nope is not known"},
		{"wn", 7430, codes.FailedPrecondition, "no network namespace of its own"},
	} {
		if _, err := forward(t, pc, c.ws, c.port); status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s port %d: %v, want %s %q", c.ws, c.port, err, c.code, c.msg)
		}
	}
	var open []agentv1.PortForward_ForwardClient
	for range agentv1.MaxPortForwardsPerWorkspace {
		s, err := forward(t, pc, "w1", 7430)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
	}
	if _, err := forward(t, pc, "w1", 7430); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "MaxPortForwardsPerWorkspace") {
		t.Errorf("one past the limit: %v, want RESOURCE_EXHAUSTED naming MaxPortForwardsPerWorkspace", err)
	}
	if err := open[0].Send(&agentv1.PortForwardRequest{CloseWrite: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := open[0].Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("closing one: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := forward(t, pc, "w1", 7430)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after one closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
