package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// downloadToken is the header value the intercepting proxy injects in the
// download through it; the server refuses /blob?auth=1 without it.
const downloadToken = "Bearer bench-token"

// httpsServer serves GET /blob?bytes=N on port 443 of the server's
// address in its namespace: N zero bytes, with a certificate for
// serverName signed by a CA of the phase's own (caPEM).
type httpsServer struct {
	srv   *http.Server
	caPEM []byte
}

// serveHTTPS starts the HTTPS server in s's namespace.
func (s *server) serveHTTPS() (*httpsServer, error) {
	cert, caPEM, err := upstream.ServerCert([]string{serverName}, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	hs := &httpsServer{caPEM: caPEM}
	hs.srv = &http.Server{Handler: http.HandlerFunc(blob), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: time.Minute}
	l, err := s.Listen(443)
	if err != nil {
		return nil, err
	}
	go func() { _ = hs.srv.ServeTLS(l, "", "") }()
	return hs, nil
}

// blob writes the zero bytes /blob asks for.
func blob(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("auth") == "1" && r.Header.Get("Authorization") != downloadToken {
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 256<<10)
	for n > 0 {
		k, err := w.Write(buf[:min(int64(len(buf)), n)])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

// downloads measures the HTTPS download of size bytes with curl from a
// task of plain (directly, trusting the server's CA by --cacert) and of
// policed (through the intercepting proxy, whose injection rule for
// serverName verifies the server with its CA), in alternating rounds,
// and prints the throughputs and their ratio.
func (p *Phase) downloads(ctx context.Context, ex *executor.Executor, plain, policed *executor.Workspace, s *server, dir string) (phase.Figures, error) {
	hs, err := s.serveHTTPS()
	if err != nil {
		return nil, fmt.Errorf("egress: the HTTPS server: %w", err)
	}
	defer hs.srv.Close()
	// In the workspace, whose tasks have a /tmp of their own.
	if err := os.WriteFile(filepath.Join(plain.Dir(), "server-ca.pem"), hs.caPEM, 0o644); err != nil {
		return nil, err
	}
	pol := &executor.EgressPolicy{DefaultDeny: true, Allow: []executor.EgressRule{{Domain: serverName, Ports: []uint16{serverPort, 443}}},
		Inject: []executor.EgressInjection{{Domain: serverName, Header: "Authorization", Value: downloadToken, CABundle: hs.caPEM}}}
	if err := policed.SetEgressPolicy(pol, nil); err != nil {
		return nil, err
	}
	var direct, proxied []float64 // MB/s
	for i := range p.downloadRounds {
		for _, v := range []struct {
			w    *executor.Workspace
			args string
			out  *[]float64
		}{{plain, "--cacert \"$HOME/server-ca.pem\" 'https://" + serverName + "/blob?bytes=", &direct}, {policed, "'https://" + serverName + "/blob?auth=1&bytes=", &proxied}} {
			mbs, err := download(ctx, ex, v.w, v.args+strconv.FormatInt(p.downloadBytes, 10)+"'", p.downloadBytes, fmt.Sprintf("%s/spill-dl-%d-%s", dir, i, v.w.ID()))
			if err != nil {
				return nil, err
			}
			*v.out = append(*v.out, mbs)
		}
	}
	d, x := best(direct), best(proxied)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.Debug)
	fmt.Fprintf(w, "egress: HTTPS download of %d MiB with curl from a workspace task (best of %d)\tMB/s\ttarget\t\n", p.downloadBytes>>20, p.downloadRounds)
	fmt.Fprintf(w, "direct (network Egress, no policy)\t%.0f\t\t\n", d)
	fmt.Fprintf(w, "through the intercepting proxy (injection rule)\t%.0f\t\t\n", x)
	fmt.Fprintf(w, "ratio\t%.2f\t>= 0.5\t\n", x/d)
	_ = w.Flush()
	return phase.Figures{"egress.download_mbps_direct": d, "egress.download_mbps_proxy": x, "egress.download_proxy_ratio": x / d}, nil
}

// best is the largest of xs: the run least disturbed by other load.
func best(xs []float64) float64 {
	var m float64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// download runs curl with args in a task of w and returns its MB/s
// (10^6 bytes per second); it fails unless size bytes arrived.
func download(ctx context.Context, ex *executor.Executor, w *executor.Workspace, args string, size int64, spill string) (float64, error) {
	cmd := "curl -sS --fail -o /dev/null -w '%{size_download} %{time_total}\\n' " + args
	t, err := ex.Start(executor.Spec{Command: cmd, SpillDir: spill, Timeout: 5 * time.Minute, Workspace: &executor.WorkspaceTask{Workspace: w}})
	if err != nil {
		return 0, err
	}
	res, err := t.Wait(ctx)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(res.Stdout.Tail)
	if res.Reason != executor.ReasonSucceeded || len(f) != 2 {
		return 0, fmt.Errorf("egress: the download of %s: %s %s: %s %s", w.ID(), res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail)
	}
	n, err1 := strconv.ParseInt(f[0], 10, 64)
	secs, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || n != size || secs <= 0 {
		return 0, fmt.Errorf("egress: the download of %s got %q, want %d bytes", w.ID(), res.Stdout.Tail, size)
	}
	return float64(n) / secs / 1e6, nil
}
