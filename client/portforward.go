package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// PortForwardOptions tune PortForward.
type PortForwardOptions struct {
	// Addresses are the local addresses to listen on (IP addresses or
	// localhost); empty means localhost, as kubectl port-forward.
	Addresses []string
	// Ready, when set, is called once every port listens, with the ports
	// as bound (a local port 0 asked for any free port).
	Ready func(ports []ForwardedPort)
	// Out receives client-go's "Forwarding from" and "Handling
	// connection" lines; ErrOut the errors of listening. Nil discards.
	Out, ErrOut io.Writer
}

// ForwardedPort is one forwarded port: Local on this machine, Remote on the
// workspace's loopback.
type ForwardedPort struct {
	Local, Remote uint16
}

// ParsePortForward reads one port specification as kubectl port-forward
// does: "LOCAL:REMOTE", ":REMOTE" or "PORT" (the same port both sides),
// LOCAL 0 to 65535 (0: any free port), REMOTE 1 to 65535. The error names
// the specification and the bound.
func ParsePortForward(spec string) (ForwardedPort, error) {
	local, remote, found := strings.Cut(spec, ":")
	if !found {
		local, remote = "", local
	}
	var fp ForwardedPort
	if local != "" {
		l, err := strconv.ParseUint(local, 10, 16)
		if err != nil {
			return fp, fmt.Errorf("port %q: local port %q must be 0-65535", spec, local)
		}
		fp.Local = uint16(l)
	}
	r, err := strconv.ParseUint(remote, 10, 16)
	if err != nil || r < 1 {
		return fp, fmt.Errorf("port %q: remote port %q must be 1-65535", spec, remote)
	}
	fp.Remote = uint16(r)
	if !found {
		fp.Local = fp.Remote
	}
	return fp, nil
}

// PortForward forwards local TCP ports to ports on the loopback of
// workspace namespace/workspace until ctx ends, through the output API's
// bashworkspaces/portforward (RBAC: create, and get for the WebSocket, on
// that subresource of output.bashtask.dev), streamed as kubectl
// port-forward does: client-go's tools/portforward over the WebSocket
// tunneling of SPDY, falling back to SPDY. ports are as ParsePortForward
// reads them. Every local connection is a connection to the workspace's
// port; a connection either side closes closes the other. It returns nil
// when ctx ends, and an error when the forward cannot start (a refusal
// names the workspace and the problem) or ends early: a forwarded
// connection that failed (nothing listens on the port, logged through
// klog as kubectl does) ends the whole forward, as in kubectl.
func (c *Client) PortForward(ctx context.Context, namespace, workspace string, ports []string, opts PortForwardOptions) error {
	for _, p := range ports {
		if _, err := ParsePortForward(p); err != nil {
			return err
		}
	}
	dialer, err := c.portForwardDialer(namespace, workspace)
	if err != nil {
		return err
	}
	addrs := opts.Addresses
	if len(addrs) == 0 {
		addrs = []string{"localhost"}
	}
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreamingWithContext(ctx, dialer, addrs, ports, ready, opts.Out, opts.ErrOut)
	if err != nil {
		return fmt.Errorf("port-forward to BashWorkspace %s/%s: %w", namespace, workspace, err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
		if opts.Ready != nil {
			opts.Ready(forwardedPorts(fw))
		}
		err = <-done
	case err = <-done:
	}
	if errors.Is(err, portforward.ErrLostConnectionToPod) {
		return fmt.Errorf("port-forward to BashWorkspace %s/%s ended: a forwarded connection failed (logged above) or the output API closed the connection", namespace, workspace)
	}
	if err != nil {
		return fmt.Errorf("port-forward to BashWorkspace %s/%s: %w", namespace, workspace, err)
	}
	return nil
}

func forwardedPorts(fw *portforward.PortForwarder) []ForwardedPort {
	got, _ := fw.GetPorts()
	out := make([]ForwardedPort, 0, len(got))
	for _, p := range got {
		out = append(out, ForwardedPort{Local: p.Local, Remote: p.Remote})
	}
	return out
}

// portForwardDialer is kubectl port-forward's dialer for the
// subresource's URL: the WebSocket tunneling of SPDY first, SPDY when the
// upgrade fails.
func (c *Client) portForwardDialer(namespace, workspace string) (httpstream.Dialer, error) {
	u := *c.base
	u.Path = path.Join(u.Path, "/apis", outputv1alpha1.Group, outputv1alpha1.Version, "namespaces", namespace,
		outputv1alpha1.ResourceWorkspaces, workspace, outputv1alpha1.SubresourcePortForward)
	rt, upgrader, err := spdy.RoundTripperFor(c.cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward: %w", err)
	}
	spdyDialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: rt}, http.MethodPost, &u)
	tunnel, err := portforward.NewSPDYOverWebsocketDialerForStreaming(cloneURL(&u), c.cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward: %w", err)
	}
	return portforward.NewFallbackDialerForStreaming(tunnel, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	}), nil
}

func cloneURL(u *url.URL) *url.URL {
	c := *u
	return &c
}
