// Package portforward is the portforward phase of hack/bench (make
// bench-portforward, docs/portforward.md): on the shared local cluster, a
// workspace runs a Python server, and the Go client's PortForward carries
// 1 GiB from it (throughput) and small HTTP requests to it (requests per
// second). kubectl port-forward to a pod needs a kubelet, which the local
// cluster does not run: the phase says so instead of a side-by-side figure.
package portforward

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
)

const (
	namespace = "bench-portforward"
	// Workspace is the name of the workspace Setup makes.
	Workspace = "pf"
	// BytesPort is the port of the server that Setup starts
	// (ServerScript) that sends the bytes asked for.
	BytesPort = 8001
	// HTTPPort is the server's HTTP port.
	HTTPPort = 8000
	// listenBacklog is the server's listen backlog, above any number of
	// connections the phase opens at once.
	listenBacklog = 128
)

// ServerScript is the server's script, the workspace's task (and the
// kubectl phase's pod's command): on bytesPort it sends the byte
// count each connection asks for (a decimal line), on httpPort it is
// `python3 -m http.server` speaking HTTP/1.1 (keep-alive). Two of
// Python's defaults are changed, as servers built for load set them: a
// listen backlog of listenBacklog instead of socketserver's 5 (connections
// arriving at once past the backlog have their SYN dropped, and the
// client's kernel sends it again after 1 s, then 3 s), and TCP_NODELAY on
// each connection (http.server writes the headers and the body apart, and
// Nagle's algorithm holds the body until the headers' delayed ACK, 40 ms
// on Linux). Both costs would be the server's, not the port-forward's
// (docs/portforward.md, "Figures").
func ServerScript(bytesPort, httpPort int) string {
	return fmt.Sprintf(`echo ok > index.html && exec python3 -u -c '
import http.server, socketserver, threading
class Zeros(socketserver.BaseRequestHandler):
    def handle(self):
        n = int(self.request.recv(64).split(b"\n")[0])
        chunk = bytes(1 << 20)
        while n > 0:
            k = min(n, len(chunk)); self.request.sendall(chunk[:k]); n -= k
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.request_queue_size = %[3]d
http.server.ThreadingHTTPServer.request_queue_size = %[3]d
http.server.SimpleHTTPRequestHandler.disable_nagle_algorithm = True
threading.Thread(target=socketserver.ThreadingTCPServer(("127.0.0.1", %[1]d), Zeros).serve_forever, daemon=True).start()
print("Serving", flush=True)
http.server.SimpleHTTPRequestHandler.protocol_version = "HTTP/1.1"
http.server.ThreadingHTTPServer(("127.0.0.1", %[2]d), http.server.SimpleHTTPRequestHandler).serve_forever()
'`, bytesPort, httpPort, listenBacklog)
}

type options struct {
	bytes       int64
	requests    int
	concurrency int
	timeout     time.Duration
}

// Phase is the portforward phase.
type Phase struct{ o options }

// Name implements phase.Phase.
func (*Phase) Name() string { return "portforward" }

// Flags implements phase.Phase.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.Int64Var(&p.o.bytes, "bytes", 1<<30, "bytes carried from the workspace's server through one forwarded connection")
	fs.IntVar(&p.o.requests, "requests", 2000, "small HTTP requests (GET of a 3-byte file) through the forward")
	fs.IntVar(&p.o.concurrency, "concurrency", 8, "HTTP requests in flight at once, each client keeping its connection")
	fs.DurationVar(&p.o.timeout, "timeout", 2*time.Minute, "limit of the workspace's and the server's start, and of each measurement")
}

// Configure implements phase.ClusterUser.
func (*Phase) Configure(*phase.ClusterOptions) {}

// Run implements phase.Phase.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	c, err := env.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	k8s, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	oc, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), p.o.timeout)
		defer cancel()
		_ = oc.DeleteWorkspace(dctx, namespace, Workspace)
	}()
	if err := Setup(ctx, k8s, oc, namespace, p.o.timeout); err != nil {
		return nil, err
	}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	ports, done, err := forward(fctx, oc)
	if err != nil {
		return nil, err
	}
	figs, err := p.measure(ctx, ports)
	stop()
	if ferr := <-done; ferr != nil && err == nil {
		err = fmt.Errorf("port-forward: %w", ferr)
	}
	return figs, err
}

// Setup makes workspace "pf" (network None) in namespace ns and starts
// the server (ServerScript) in it, waiting at most timeout for each.
func Setup(ctx context.Context, k8s ctrlclient.Client, oc *client.Client, ns string, timeout time.Duration) error {
	nso := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := k8s.Create(ctx, nso); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if _, err := oc.CreateWorkspace(ctx, client.WorkspaceOptions{Namespace: ns, Name: Workspace, Network: string(v1.NetworkNone)}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := oc.WaitWorkspaceReady(wctx, ns, Workspace); err != nil {
		return err
	}
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "server-"}}
	bt.Spec.Command, bt.Spec.Workspace, bt.Spec.TimeoutSeconds = ServerScript(BytesPort, HTTPPort), ptr.To(Workspace), ptr.To[int32](600)
	if err := k8s.Create(ctx, bt); err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); ; {
		var got v1.BashTask
		if err := k8s.Get(ctx, ctrlclient.ObjectKeyFromObject(bt), &got); err != nil {
			return err
		}
		if got.Status.Stdout != nil && strings.Contains(ptr.Deref(got.Status.Stdout.Tail, ""), "Serving") {
			return nil
		}
		if got.Status.Reason != nil || time.Now().After(deadline) {
			return fmt.Errorf("the server did not start: %+v", got.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// forward starts the client's PortForward of 8001 and 8000 and returns
// their local ports once they listen.
func forward(ctx context.Context, oc *client.Client) ([]client.ForwardedPort, <-chan error, error) {
	ready := make(chan []client.ForwardedPort, 1)
	done := make(chan error, 1)
	go func() {
		done <- oc.PortForward(ctx, namespace, Workspace, []string{fmt.Sprintf("0:%d", BytesPort), fmt.Sprintf("0:%d", HTTPPort)}, client.PortForwardOptions{
			Ready: func(p []client.ForwardedPort) { ready <- p },
		})
	}()
	select {
	case p := <-ready:
		return p, done, nil
	case err := <-done:
		return nil, nil, fmt.Errorf("port-forward ended before it listened: %w", err)
	}
}

// measure carries the bytes, then the requests, and prints the figures.
func (p *Phase) measure(ctx context.Context, ports []client.ForwardedPort) (phase.Figures, error) {
	mibs, err := Throughput(ctx, ports[0].Local, p.o.bytes)
	if err != nil {
		return nil, fmt.Errorf("throughput: %w", err)
	}
	rps, err := RequestRate(ctx, ports[1].Local, p.o.requests, p.o.concurrency, true)
	if err != nil {
		return nil, fmt.Errorf("requests: %w", err)
	}
	cps, err := RequestRate(ctx, ports[1].Local, p.o.requests/10, p.o.concurrency, false)
	if err != nil {
		return nil, fmt.Errorf("requests on new connections: %w", err)
	}
	fmt.Printf("\nport-forward through the output API (client.PortForward), workspace of network None\n")
	fmt.Printf("  %-44s %10.1f MiB/s\n", fmt.Sprintf("throughput, %d MiB through one connection", p.o.bytes>>20), mibs)
	fmt.Printf("  %-44s %10.0f req/s\n", fmt.Sprintf("small HTTP GETs, %d in flight, keep-alive", p.o.concurrency), rps)
	fmt.Printf("  %-44s %10.0f req/s\n", fmt.Sprintf("small HTTP GETs, %d in flight, new connection each", p.o.concurrency), cps)
	fmt.Printf("  kubectl port-forward to a pod: not measured here (the local cluster runs no kubelet); make bench-cluster-interactive measures it on the one-node cluster\n")
	return phase.Figures{"portforward.throughput_mib_s": mibs, "portforward.http_requests_per_s": rps,
		"portforward.http_new_connections_per_s": cps}, nil
}

// Throughput asks the server for n bytes through local port and reads
// them, in MiB/s.
func Throughput(ctx context.Context, port uint16, n int64) (float64, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "%d\n", n); err != nil {
		return 0, err
	}
	got, err := io.Copy(io.Discard, conn)
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("read %d bytes, want %d", got, n)
	}
	return float64(n) / (1 << 20) / time.Since(start).Seconds(), nil
}

// RequestRate makes total GETs with concurrency clients, each keeping its
// connection or making a new one per request, in requests per second.
func RequestRate(ctx context.Context, port uint16, total, concurrency int, keepAlive bool) (float64, error) {
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", port)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, concurrency)
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableKeepAlives: !keepAlive}}
			for next.Add(1) <= int64(total) {
				if err := get(ctx, hc, url); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := errors.Join(drain(errs)...); err != nil {
		return 0, err
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

func get(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

func drain(c <-chan error) []error {
	var out []error
	for err := range c {
		out = append(out, err)
	}
	return out
}
