package outputapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	portforwardconsts "k8s.io/apimachinery/pkg/util/portforward"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/streaming/pkg/httpstream/wsstream"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// PortForwardAgents hands out a client of a node's PortForward service
// (agentpool.AgentReaders).
type PortForwardAgents interface {
	// PortForwardClient returns a client for node's agent, or an error
	// when none is reachable.
	PortForwardClient(ctx context.Context, node string) (agentv1.PortForwardClient, error)
}

// The timeouts of a port-forward connection, the kubelet's defaults
// (--streaming-connection-idle-timeout, and the stream creation timeout
// of its streaming server).
const (
	// portForwardIdleTimeout ends a port-forward connection without a
	// stream for that long.
	portForwardIdleTimeout = 4 * time.Hour
	// portForwardStreamCreationTimeout bounds the wait for a forwarded
	// connection's second stream (data and error come as a pair).
	portForwardStreamCreationTimeout = 30 * time.Second
)

// portForwardREST serves bashworkspaces/portforward as a rest.Connecter,
// the way kube-apiserver serves pods/portforward (docs/portforward.md):
// SPDY (POST), the WebSocket tunneling of SPDY and the v4 WebSocket
// protocol (GET), each authorized as create on bashworkspaces/portforward
// of output.bashtask.dev.
type portForwardREST struct {
	subresource
	s *Server
}

var (
	_ rest.Connecter            = (*portForwardREST)(nil)
	_ rest.Storage              = (*portForwardREST)(nil)
	_ rest.Scoper               = (*portForwardREST)(nil)
	_ rest.SingularNameProvider = (*portForwardREST)(nil)
)

// Connect implements rest.Connecter: the caller must also be allowed to
// create bashworkspaces/portforward (a GET, which a WebSocket is, was
// authorized as get), the workspace must be on a node with a network
// namespace of its own, and the connection is upgraded.
func (p *portForwardREST) Connect(ctx context.Context, name string, opts runtime.Object, _ rest.Responder) (http.Handler, error) {
	o, ok := opts.(*outputv1alpha1.PortForwardOptions)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected options %T", opts))
	}
	if err := authorizeCreate(ctx, p.s.authz); err != nil {
		return nil, err
	}
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	w, err := p.s.getWorkspace(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	node, err := portForwardNode(w)
	if err != nil {
		return nil, err
	}
	v4, err := portforward.BuildV4Options(o.Ports)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return p.s.portForwardHandler(w, node, v4), nil
}

// portForwardNode is the node holding w, refusing a workspace that is not
// on one or whose network has no namespace of its own.
func portForwardNode(w *bashtaskv1alpha1.BashWorkspace) (string, error) {
	node := ptr.Deref(w.Status.NodeName, "")
	phase := ptr.Deref(w.Status.Phase, "")
	switch {
	case ptr.Deref(w.Status.Network, "") == bashtaskv1alpha1.NetworkNode:
		return "", apierrors.NewBadRequest(fmt.Sprintf("BashWorkspace %s/%s has network Node: it has no network namespace of its own (its loopback is the node's), so it cannot be port-forwarded to; use network None or Egress", w.Namespace, w.Name))
	case node == "" || phase != bashtaskv1alpha1.WorkspaceReady:
		return "", apierrors.NewServiceUnavailable(fmt.Sprintf("BashWorkspace %s/%s is not Ready on a node (phase %q, node %q): port-forward needs a Ready workspace", w.Namespace, w.Name, phase, node))
	}
	return node, nil
}

// portForwardHandler serves the connection: SPDY, or its WebSocket
// tunneling translated to SPDY by apiserver's tunneling handler, as
// kube-apiserver and the kubelet do (the kubelet's proxies to its
// streaming server; here upgradeAfterHijack stands in for that proxy).
func (s *Server) portForwardHandler(w *bashtaskv1alpha1.BashWorkspace, node string, v4 *portforward.V4Options) http.Handler {
	protocols := []string{portforwardconsts.PortForwardV1Name}
	spdy := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		f := &workspaceForwarder{s: s, ctx: req.Context(), node: node, uid: string(w.UID)}
		portforward.ServePortForward(rw, req, f, w.Namespace+"/"+w.Name, string(w.UID), v4, portForwardIdleTimeout, portForwardStreamCreationTimeout, protocols)
	})
	tunneled := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		spdy.ServeHTTP(newUpgradeAfterHijack(rw), req)
	})
	return proxy.NewTranslatingHandler(spdy, proxy.NewTunnelingHandler(tunneled), wsstream.IsWebSocketRequestWithTunnelingProtocol)
}

// authorizeCreate checks that the request's user may also create the
// subresource, as kube-apiserver does for the GET of pods/portforward
// (AuthorizePodWebsocketUpgradeCreatePermission).
func authorizeCreate(ctx context.Context, a authorizer.Authorizer) error {
	ri, ok := genericapirequest.RequestInfoFrom(ctx)
	if !ok {
		return apierrors.NewInternalError(errors.New("no request info in context"))
	}
	if ri.Verb == "create" {
		return nil
	}
	if a == nil {
		return apierrors.NewInternalError(errors.New("no authorizer available"))
	}
	attrs, err := filters.GetAuthorizerAttributes(ctx)
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("building authorizer attributes: %w", err))
	}
	decision, reason, err := a.Authorize(ctx, createVerb{attrs})
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if decision != authorizer.DecisionAllow {
		return apierrors.NewForbidden(schema.GroupResource{Group: ri.APIGroup, Resource: ri.Resource + "/" + ri.Subresource}, ri.Name,
			fmt.Errorf("port-forward needs create on %s/%s in %s: %s", ri.Resource, ri.Subresource, ri.APIGroup, reason))
	}
	return nil
}

// createVerb is a request's attributes with the verb create.
type createVerb struct{ authorizer.Attributes }

func (createVerb) GetVerb() string { return "create" }

// workspaceForwarder forwards each stream of one port-forward request to
// its workspace's agent (portforward.PortForwarder).
type workspaceForwarder struct {
	s *Server
	// ctx is the request's: a forwarded connection ends with it.
	ctx       context.Context
	node, uid string
}

// PortForward carries one forwarded connection through a Forward stream
// of the agent: the stream's bytes to the workspace, half-closed at the
// client's EOF, and the workspace's bytes back until its side closes. The
// error (the agent's message: connection refused, the limit) is written
// to the connection's error stream by the caller.
func (f *workspaceForwarder) PortForward(_ context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	fs, err := f.open(ctx, port)
	if err != nil {
		return err
	}
	go sendForwarded(fs, stream)
	for {
		m, err := fs.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errors.New(status.Convert(err).Message())
		}
		if _, err := stream.Write(m.GetData()); err != nil {
			return nil // the client went away
		}
	}
}

// open starts a Forward stream to port and waits for the agent's dial.
func (f *workspaceForwarder) open(ctx context.Context, port int32) (agentv1.PortForward_ForwardClient, error) {
	if f.s.cfg.PortForwards == nil {
		return nil, errors.New("this output API server does not forward ports")
	}
	c, err := f.s.cfg.PortForwards.PortForwardClient(ctx, f.node)
	if err != nil {
		return nil, fmt.Errorf("the agent of node %s: %w", f.node, err)
	}
	fs, err := c.Forward(ctx)
	if err != nil {
		return nil, errors.New(status.Convert(err).Message())
	}
	if err := fs.Send(&agentv1.PortForwardRequest{Open: &agentv1.PortForwardOpen{WorkspaceUid: f.uid, Port: port}}); err != nil {
		return nil, fmt.Errorf("the agent of node %s: %w", f.node, err)
	}
	if _, err := fs.Recv(); err != nil {
		return nil, errors.New(status.Convert(err).Message())
	}
	return fs, nil
}

// sendForwarded sends the client's bytes to the agent in chunks of at
// most MaxPortForwardChunkBytes, then half-closes at the client's EOF.
func sendForwarded(fs agentv1.PortForward_ForwardClient, stream io.Reader) {
	buf := make([]byte, agentv1.MaxPortForwardChunkBytes)
	for {
		n, err := stream.Read(buf)
		if n > 0 {
			if fs.Send(&agentv1.PortForwardRequest{Data: buf[:n]}) != nil {
				return
			}
		}
		if err != nil {
			_ = fs.Send(&agentv1.PortForwardRequest{CloseWrite: true})
			_ = fs.CloseSend()
			return
		}
	}
}

// decodePortForwardOptions reads the query parameters: each ports value a
// TCP port, 1 to 65535; a bad one is an error naming it.
func decodePortForwardOptions(q url.Values, o *outputv1alpha1.PortForwardOptions) error {
	for _, v := range q[outputv1alpha1.ParamPorts] {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil || p < 1 {
			return fmt.Errorf("ports %q: must be a TCP port, 1-65535", v)
		}
		o.Ports = append(o.Ports, int32(p))
	}
	return nil
}
