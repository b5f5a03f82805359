//go:build linux

package executor

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// egressProxyPort is the TCP port of a workspace's intercepting proxy on
// the host end of its veth pair; nftables redirects the workspace's
// connections to port 443 of an intercepted address there.
const egressProxyPort = 15443

// egressPeekTimeout bounds the wait for a connection's ClientHello and the
// TLS handshake with the task.
const egressPeekTimeout = 10 * time.Second

// egressProxy is a workspace's intercepting proxy (docs/egress.md): it
// reads the ClientHello of each redirected connection; a server name
// with an injection rule gets a TLS server end with a leaf certificate of
// the workspace's CA and an httputil.ReverseProxy that adds the rule's
// header, verifies the upstream server against the node's roots (or the
// rule's CA bundle) and dials the address the task connected to; any
// other name the policy allows passes through untouched to that address.
type egressProxy struct {
	g          *egressGuard
	ca         *egressCA
	bundlePath string // the trust bundle, under /run so that tasks get it (Config.RunPaths)
	ln         net.Listener
	conns      chan net.Conn // intercepted connections for srv
	srv        *http.Server
	ctx        context.Context // cancelled by close
	cancel     context.CancelFunc
	wg         sync.WaitGroup

	mu         sync.Mutex
	transports map[string]*http.Transport // per rule domain and CA bundle
}

// egressRunDir is where the agent keeps the trust bundles of its
// workspaces: under /run, which tasks get a bind of (Config.RunPaths).
const egressRunDir = "/run/bashtask-egress-"

// startProxy starts the proxy when the policy has injection rules.
func (g *egressGuard) startProxy() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.startProxyLocked()
}

// startProxyLocked starts the proxy the first time the policy has
// injection rules: the CA, the trust bundle and the listener; it stays
// until the guard closes. The caller holds g.mu.
func (g *egressGuard) startProxyLocked() error {
	if g.proxy != nil || len(g.policy.Inject) == 0 {
		return nil
	}
	ca, err := newEgressCA(g.link.name)
	if err != nil {
		return fmt.Errorf("the workspace's egress CA: %w", err)
	}
	px := &egressProxy{g: g, ca: ca, conns: make(chan net.Conn), transports: map[string]*http.Transport{}}
	px.ctx, px.cancel = context.WithCancel(context.Background())
	dir := egressRunDir + g.e.plan.id
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("the workspace's trust bundle: %w", err)
	}
	px.bundlePath = filepath.Join(dir, g.link.name+"-ca-bundle.pem")
	if err := os.WriteFile(px.bundlePath, ca.trustBundle(), 0o644); err != nil {
		return fmt.Errorf("the workspace's trust bundle: %w", err)
	}
	addr := netip.AddrPortFrom(g.link.host, egressProxyPort).String()
	if px.ln, err = net.Listen("tcp4", addr); err != nil {
		_ = os.Remove(px.bundlePath)
		return fmt.Errorf("the workspace's egress proxy on %s: %w", addr, err)
	}
	px.srv = &http.Server{
		Handler: px.handler(),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connInfoKey{}, c.(*interceptedConn))
		},
		ReadHeaderTimeout: time.Minute,
	}
	px.wg.Add(2)
	go func() { defer px.wg.Done(); _ = px.srv.Serve(chanListener{px}) }()
	go func() { defer px.wg.Done(); px.accept() }()
	g.proxy = px
	return nil
}

// trustBundle is the path of the workspace's trust bundle once its
// policy had injection rules, else "".
func (g *egressGuard) trustBundle() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.proxy == nil {
		return ""
	}
	return g.proxy.bundlePath
}

// close stops the proxy: its listener, the intercepted connections and
// the passed-through ones, and removes the bundle. Safe on nil.
func (px *egressProxy) close() {
	if px == nil {
		return
	}
	px.cancel()
	px.ln.Close()
	_ = px.srv.Close()
	px.wg.Wait()
	px.mu.Lock()
	for _, t := range px.transports {
		t.CloseIdleConnections()
	}
	px.mu.Unlock()
	_ = os.Remove(px.bundlePath)
}

// accept hands each connection to serveConn until the listener closes.
func (px *egressProxy) accept() {
	for {
		c, err := px.ln.Accept()
		if err != nil {
			return
		}
		px.wg.Add(1)
		go func() {
			defer px.wg.Done()
			px.serveConn(c.(*net.TCPConn))
		}()
	}
}

// serveConn peeks the ClientHello of c and intercepts it, passes it
// through or refuses it.
func (px *egressProxy) serveConn(c *net.TCPConn) {
	defer context.AfterFunc(px.ctx, func() { c.Close() })()
	dst, err := originalDst(c)
	if err != nil || px.deniedDst(dst.Addr()) {
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Now().Add(egressPeekTimeout))
	sni, hello, err := peekServerName(c)
	if err != nil {
		c.Close()
		return
	}
	conn := &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c)}
	px.g.mu.Lock()
	pol := px.g.policy
	onRefused := px.g.onRefused
	px.g.mu.Unlock()
	if rule := pol.injection(sni); rule != nil && sni != "" {
		px.intercept(conn, sni, dst, *rule)
		return
	}
	if gr := pol.grant(sni); sni != "" && (!gr.allowed || (!gr.any && !containsPort(gr.ports, dst.Port()))) {
		// The server name is one the policy refuses: an address shared
		// with an intercepted name does not reach it.
		if onRefused != nil {
			onRefused(EgressRefusal{Name: sni, Type: "TLS"})
		}
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	px.passThrough(conn, dst)
}

func containsPort(ports []uint16, p uint16) bool {
	for _, x := range ports {
		if x == p {
			return true
		}
	}
	return false
}

// deniedDst says whether a is in the ranges no task reaches (the forward
// chain's): the proxy dials from the agent's namespace, where that chain
// does not apply.
func (px *egressProxy) deniedDst(a netip.Addr) bool {
	for _, d := range px.g.e.plan.denied() {
		if d.Contains(a) {
			return true
		}
	}
	return false
}

// originalDst is the address c was sent to before nftables redirected it
// (SO_ORIGINAL_DST, a sockaddr_in).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	})
	return out, errors.Join(err, serr)
}

// peekServerName reads c's ClientHello with crypto/tls and returns its
// server name (lower case) and the bytes read, which the connection's
// next user reads again.
func peekServerName(c net.Conn) (string, []byte, error) {
	rec := &recordConn{Conn: c}
	var name string
	seen := false
	errPeeked := errors.New("peeked")
	_ = tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name, seen = strings.ToLower(strings.TrimSuffix(h.ServerName, ".")), true
		return nil, errPeeked
	}}).Handshake()
	if !seen {
		return "", nil, errNotTLS
	}
	return name, rec.buf.Bytes(), nil
}

// recordConn keeps what is read and writes nothing (the peek's handshake
// never answers).
type recordConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *recordConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.buf.Write(p[:n])
	return n, err
}

func (c *recordConn) Write(p []byte) (int, error) { return len(p), nil }

// replayConn reads the peeked bytes again, then the connection.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// passThrough copies c to a connection to dst and back, untouched.
func (px *egressProxy) passThrough(c *replayConn, dst netip.AddrPort) {
	defer c.Close()
	up, err := net.DialTimeout("tcp4", dst.String(), egressPeekTimeout)
	if err != nil {
		return
	}
	defer up.Close()
	defer context.AfterFunc(px.ctx, func() { up.Close() })()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		_ = up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(c, up)
	_ = c.Conn.(*net.TCPConn).CloseWrite()
	<-done
}

// interceptedConn is a task's connection after the TLS handshake with the
// proxy, as the HTTP server reads it, with what the handler needs.
type interceptedConn struct {
	net.Conn
	sni  string
	dst  netip.AddrPort
	rule EgressInjection
	tr   *http.Transport
}

type connInfoKey struct{}

// intercept ends TLS with the task with a leaf certificate for sni and
// hands the connection to the HTTP server.
func (px *egressProxy) intercept(c *replayConn, sni string, dst netip.AddrPort, rule EgressInjection) {
	cert, err := px.ca.leaf(sni)
	if err != nil {
		c.Close()
		return
	}
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := tc.Handshake(); err != nil {
		tc.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	tr, err := px.transport(rule)
	if err != nil {
		tc.Close()
		return
	}
	select {
	case px.conns <- &interceptedConn{Conn: tc, sni: sni, dst: dst, rule: rule, tr: tr}:
	case <-px.ctx.Done():
		tc.Close()
	}
}

// transport is the upstream transport of rule: it verifies the server
// against the node's roots or the rule's CA bundle and dials the address
// the task connected to.
func (px *egressProxy) transport(rule EgressInjection) (*http.Transport, error) {
	key := rule.Domain + "\x00" + string(rule.CABundle)
	px.mu.Lock()
	defer px.mu.Unlock()
	if t := px.transports[key]; t != nil {
		return t, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(rule.CABundle) > 0 {
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM(rule.CABundle)
	}
	d := &net.Dialer{Timeout: egressPeekTimeout}
	t := &http.Transport{
		TLSClientConfig:     cfg,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ic, _ := ctx.Value(connInfoKey{}).(*interceptedConn)
			if ic == nil {
				return nil, errors.New("no intercepted connection")
			}
			return d.DialContext(ctx, "tcp4", ic.dst.String())
		},
	}
	px.transports[key] = t
	return t, nil
}

// chanListener hands the HTTP server the intercepted connections.
type chanListener struct{ px *egressProxy }

func (l chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.px.conns:
		return c, nil
	case <-l.px.ctx.Done():
		return nil, net.ErrClosed
	}
}

func (l chanListener) Close() error   { return nil }
func (l chanListener) Addr() net.Addr { return l.px.ln.Addr() }

// handler is the reverse proxy behind the TLS end: a request whose Host
// is not the connection's server name gets 421; others go to the server
// name with the rule's header set (a header of that name the task sent
// is replaced); an upstream failure is a 502 naming the host.
func (px *egressProxy) handler() http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			ic := pr.In.Context().Value(connInfoKey{}).(*interceptedConn)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", ic.sni
			if ic.dst.Port() != 443 {
				pr.Out.URL.Host = net.JoinHostPort(ic.sni, fmt.Sprint(ic.dst.Port()))
			}
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(ic.rule.Header, ic.rule.Value)
			if ic.rule.ScrubResponses {
				pr.Out.Header.Set("Accept-Encoding", "identity")
			}
		},
		Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			return r.Context().Value(connInfoKey{}).(*interceptedConn).tr.RoundTrip(r)
		}),
		ModifyResponse: func(resp *http.Response) error {
			ic := resp.Request.Context().Value(connInfoKey{}).(*interceptedConn)
			if ic.rule.ScrubResponses {
				scrubResponse(resp, ic.rule.Value)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			ic := r.Context().Value(connInfoKey{}).(*interceptedConn)
			msg := strings.ReplaceAll(err.Error(), ic.rule.Value, EgressScrubbed)
			http.Error(w, fmt.Sprintf("bashtask egress proxy: upstream %s (%s): %s", ic.sni, ic.dst, msg), http.StatusBadGateway)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ic := r.Context().Value(connInfoKey{}).(*interceptedConn)
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !strings.EqualFold(strings.TrimSuffix(host, "."), ic.sni) {
			http.Error(w, fmt.Sprintf("bashtask egress proxy: Host %q is not the TLS server name %q of this connection", r.Host, ic.sni), http.StatusMisdirectedRequest)
			return
		}
		rp.ServeHTTP(w, r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// scrubResponse replaces value in resp's headers and body.
func scrubResponse(resp *http.Response, value string) {
	for k, vs := range resp.Header {
		for i, v := range vs {
			resp.Header[k][i] = strings.ReplaceAll(v, value, EgressScrubbed)
		}
	}
	resp.Body = &scrubReader{src: resp.Body, old: []byte(value), new: []byte(EgressScrubbed)}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}

// scrubReader replaces every occurrence of old in src with new, streaming:
// it holds back at most len(old)-1 bytes that may start an occurrence.
type scrubReader struct {
	src      io.ReadCloser
	old, new []byte
	pending  []byte // read, not yet checked
	out      []byte // checked, not yet returned
	eof      bool
	err      error
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof {
			if len(r.pending) == 0 {
				return 0, r.err
			}
			r.out, r.pending = r.pending, nil
			break
		}
		buf := make([]byte, 32<<10)
		n, err := r.src.Read(buf)
		r.pending = append(r.pending, buf[:n]...)
		if err != nil {
			r.eof, r.err = true, err
		}
		r.scan()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// scan moves what cannot start an occurrence from pending to out,
// replacing the occurrences.
func (r *scrubReader) scan() {
	for {
		if i := bytes.Index(r.pending, r.old); i >= 0 {
			r.out = append(append(r.out, r.pending[:i]...), r.new...)
			r.pending = r.pending[i+len(r.old):]
			continue
		}
		if keep := len(r.old) - 1; len(r.pending) > keep {
			r.out = append(r.out, r.pending[:len(r.pending)-keep]...)
			r.pending = append([]byte(nil), r.pending[len(r.pending)-keep:]...)
		}
		return
	}
}

func (r *scrubReader) Close() error { return r.src.Close() }
