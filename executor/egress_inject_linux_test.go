//go:build linux

package executor

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// injectServer is an HTTPS server in the test internet's namespace, on
// port 443 of its address, with a certificate of its own CA for the names
// under probe.test. It records the Authorization header of each request
// by path and client; paths under /git/ answer 401 without the token and
// a ref advertisement with it; /echo returns the Authorization header in
// its body and in the header X-Echo.
type injectServer struct {
	caPEM []byte
	token string

	mu   sync.Mutex
	seen map[string]string // "path client" -> Authorization
}

// newInjectServer serves in ti's namespace until the test ends.
func newInjectServer(t *testing.T, ti *testInternet, token string) *injectServer {
	t.Helper()
	s := &injectServer{token: token, seen: map[string]string{}}
	cert, caPEM := testServerCert(t, []string{"api.probe.test", "scrub.probe.test", "plain.probe.test", "bad.probe.test", "no.probe.test"})
	s.caPEM = caPEM
	srv := &http.Server{Handler: s, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	if err := upstream.InNetns(ti.ns, func() error {
		l, err := net.Listen("tcp4", netip.AddrPortFrom(ti.addr, 443).String())
		if err != nil {
			return err
		}
		go func() { _ = srv.ServeTLS(l, "", "") }()
		t.Cleanup(func() { srv.Close() })
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *injectServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	client, _, _ := strings.Cut(r.UserAgent(), "/")
	s.mu.Lock()
	s.seen[r.Host+r.URL.Path+" "+client] = auth
	s.mu.Unlock()
	ok := auth == "Bearer "+s.token
	switch {
	case r.URL.Path == "/echo":
		w.Header().Set("X-Echo", auth)
		fmt.Fprintf(w, "you sent %s\n", auth)
	case strings.HasPrefix(r.URL.Path, "/git/") && ok:
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		pkt := func(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }
		sha := strings.Repeat("1", 40)
		fmt.Fprint(w, pkt("# service=git-upload-pack\n")+"0000"+pkt(sha+" HEAD\x00agent=test\n")+pkt(sha+" refs/heads/main\n")+"0000")
	case !ok:
		w.Header().Set("WWW-Authenticate", `Bearer realm="test"`)
		http.Error(w, "no token", http.StatusUnauthorized)
	default:
		fmt.Fprintln(w, "hello with token")
	}
}

// saw is the Authorization header the server saw for a request to host
// and path by client (the User-Agent's product), and whether there was one.
func (s *injectServer) saw(hostPath, client string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.seen[hostPath+" "+client]
	return v, ok
}

// testServerCert is a CA and a server certificate for names signed by it.
func testServerCert(t *testing.T, names []string) (tls.Certificate, []byte) {
	t.Helper()
	cert, caPEM, err := upstream.ServerCert(names, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return cert, caPEM
}

// randomToken is a token no file holds by chance.
func randomToken(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "tok" + hex.EncodeToString(b)
}

// injectCommand is the task of TestWorkspaceEgressInjection: curl (with
// its own trace of what it sent and received), Python's urllib and git
// against the intercepted name; the scrubbed echo; a rule whose upstream
// fails verification; a name passed through; a refused server name at the
// intercepted address. It keeps what it can read in files of its
// workspace for the test to search.
const injectCommand = `set -u
mkdir -p out
env > out/env; cat /proc/self/environ > out/environ
curl -sS --trace-ascii out/curl-trace --fail https://api.probe.test/hello > out/curl-body && echo curl ok
/usr/bin/python3 -c 'import urllib.request; print(urllib.request.urlopen("https://api.probe.test/hello").read().decode().strip())' > out/python-body && echo python ok
git ls-remote https://api.probe.test/git/repo > out/git-refs 2> out/git-err && echo git ok
curl -sS -D out/scrub-headers https://scrub.probe.test/echo > out/scrub-body && echo scrub ok
echo bad $(curl -s -o out/bad-body -w '%{http_code}' https://bad.probe.test/hello)
curl -skS https://plain.probe.test/hello > out/plain-body && echo plain ok
if curl -skS --max-time 5 --resolve no.probe.test:443:` + "$ADDR" + ` https://no.probe.test/hello > out/no-body 2>out/no-err; then echo no reached; else echo no refused; fi
cp -r /run out/run 2>/dev/null; cat "$SSL_CERT_FILE" > out/bundle
`

// A workspace's injection rule: curl, Python and git trust the
// workspace's CA and reach the intercepted name, whose server sees the
// header; the token is in nothing the task can read (its environment,
// /proc/self/environ, its files, /run, the trace of its own client); a
// rule with ScrubResponses hides the echoed value while one without lets
// it through (the documented limit); an upstream that fails verification
// is a 502 naming the host; a name without a rule passes through
// untouched; a server name the policy refuses at the intercepted address
// is cut.
func TestWorkspaceEgressInjection(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	token := randomToken(t)
	srv := newInjectServer(t, ti, token)
	ex := tenantExecutor(t, func(c *Config) { c.Egress = egressTestConfig(ti) })
	w := testWorkspace(t, ex, NetworkEgress, false)
	rule := func(domain string) EgressInjection {
		return EgressInjection{Domain: domain, Header: "Authorization", Value: "Bearer " + token, CABundle: srv.caPEM}
	}
	scrub, bad := rule("scrub.probe.test"), rule("bad.probe.test")
	scrub.ScrubResponses, bad.CABundle = true, nil
	pol := &EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "*.probe.test"}}, Deny: []EgressRule{{Domain: "no.probe.test"}},
		Inject: []EgressInjection{rule("api.probe.test"), scrub, bad}}
	if err := w.SetEgressPolicy(pol, nil); err != nil {
		t.Fatal(err)
	}
	res := run(t, ex, wsSpec(t, w, "ADDR="+ti.addr.String()+"\n"+injectCommand, "", false))
	out := res.Stdout.Tail
	for _, want := range []string{"curl ok", "python ok", "git ok", "scrub ok", "bad 502", "plain ok", "no refused"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("task output lacks %q:\n%s\nstderr: %s", want, out, res.Stderr.Tail)
		}
	}
	for _, c := range []struct{ path, client, want string }{
		{"api.probe.test/hello", "curl", "Bearer " + token},
		{"api.probe.test/hello", "Python-urllib", "Bearer " + token},
		{"api.probe.test/git/repo/info/refs", "git", "Bearer " + token},
		{"plain.probe.test/hello", "curl", ""},
	} {
		if got, ok := srv.saw(c.path, c.client); !ok || got != c.want {
			t.Errorf("server saw %s from %s with Authorization %q (seen %t), want %q", c.path, c.client, got, ok, c.want)
		}
	}
	if _, ok := srv.saw("no.probe.test/hello", "curl"); ok {
		t.Error("the refused server name reached the server")
	}
	readOut := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(w.Dir(), "out", name))
		return string(b)
	}
	if b := readOut("bad-body"); !strings.Contains(b, "bad.probe.test") || !strings.Contains(b, "certificate") {
		t.Errorf("the 502's body %q names neither the host nor the certificate error", b)
	}
	if b := readOut("scrub-body") + readOut("scrub-headers"); strings.Count(b, EgressScrubbed) != 2 {
		t.Errorf("scrubbed echo: %q, want %q in body and header", b, EgressScrubbed)
	}
	if !strings.Contains(readOut("curl-trace"), "Host: api.probe.test") {
		t.Error("curl's trace lacks the request it sent; the search below would prove nothing")
	}
	if !strings.Contains(readOut("bundle"), "bashtask egress CA") {
		t.Error("the task's SSL_CERT_FILE lacks the workspace CA")
	}
	assertTokenAbsent(t, w.Dir(), token, res)

	// Without ScrubResponses the echo reaches the task: the design's limit.
	res = run(t, ex, wsSpec(t, w, `curl -sS https://api.probe.test/echo`, "", false))
	if !strings.Contains(res.Stdout.Tail, token) {
		t.Errorf("echo without scrubbing: %q, want the token echoed", res.Stdout.Tail)
	}
}

// assertTokenAbsent fails when token is in any file under dir or in the
// task's output.
func assertTokenAbsent(t *testing.T, dir, token string, res Result) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		files++
		if bytes.Contains(b, []byte(token)) {
			t.Errorf("the token is in %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 8 {
		t.Errorf("only %d files searched", files)
	}
	if strings.Contains(res.Stdout.Tail+res.Stderr.Tail, token) {
		t.Error("the token is in the task's output")
	}
}
