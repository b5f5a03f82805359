package tlsutil

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type pki struct {
	dir         string
	ca          *CA
	caFile      string
	serverFiles *Files
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := WriteFileAtomic(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(LeafOptions{CommonName: "agent", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cf, kf, err := srv.WriteFiles(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	sf, err := NewFiles(cf, kf, caFile)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{dir: dir, ca: ca, caFile: caFile, serverFiles: sf}
}

// clientFiles writes a client key pair trusting the server's CA.
func (p *pki) client(t *testing.T, name string, kp KeyPair) *Files {
	t.Helper()
	cf, kf, err := kp.WriteFiles(p.dir, name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFiles(cf, kf, p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// handshake runs one TLS handshake over loopback TCP (buffered, unlike
// net.Pipe, so neither side's close blocks) and returns the server's and the
// client's error.
func handshake(t *testing.T, server *tls.Config, client *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, server)
		err := s.HandshakeContext(t.Context())
		if err == nil {
			// TLS 1.3: the client learns about a refusal only when it
			// reads; one byte makes it read.
			_, err = s.Write([]byte{1})
		}
		s.Close()
		done <- err
	}()
	c := tls.Client(b, client)
	clientErr = c.HandshakeContext(t.Context())
	if clientErr == nil {
		_, clientErr = c.Read(make([]byte, 1))
	}
	c.Close()
	return <-done, clientErr
}

func TestServerConfigRefusesBeforeUse(t *testing.T) {
	p := newPKI(t)
	other, err := NewCA("other-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *CA, o LeafOptions) KeyPair {
		kp, err := ca.Issue(o)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	tests := map[string]struct {
		kp       KeyPair
		wantOK   bool
		wantKind error
	}{
		"controller identity as common name": {kp: issue(p.ca, LeafOptions{CommonName: "bashtask-controller", Client: true}), wantOK: true},
		"controller identity as DNS SAN":     {kp: issue(p.ca, LeafOptions{CommonName: "x", DNSNames: []string{"bashtask-controller"}, Client: true}), wantOK: true},
		"wrong identity":                     {kp: issue(p.ca, LeafOptions{CommonName: "someone-else", Client: true}), wantKind: ErrWrongIdentity},
		"other CA":                           {kp: issue(other, LeafOptions{CommonName: "bashtask-controller", Client: true})},
		"server-only key usage":              {kp: issue(p.ca, LeafOptions{CommonName: "bashtask-controller", Server: true})},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			scfg, err := ServerConfig(p.serverFiles, "bashtask-controller")
			if err != nil {
				t.Fatal(err)
			}
			ccfg, err := ClientConfig(p.client(t, "client", tc.kp), "127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			serr, cerr := handshake(t, scfg, ccfg)
			if got := serr == nil && cerr == nil; got != tc.wantOK {
				t.Fatalf("connection accepted = %v, want %v (server: %v, client: %v)", got, tc.wantOK, serr, cerr)
			}
			if tc.wantKind != nil && !errors.Is(serr, tc.wantKind) {
				t.Errorf("server error %v, want %v", serr, tc.wantKind)
			}
		})
	}
}

func TestFilesReloadOnChange(t *testing.T) {
	p := newPKI(t)
	old, _, err := p.serverFiles.Current()
	if err != nil {
		t.Fatal(err)
	}
	kp, err := p.ca.Issue(LeafOptions{CommonName: "agent-rotated", Server: true})
	if err != nil {
		t.Fatal(err)
	}
	// A later modification time than the first file's, as a rotation has.
	if _, _, err := kp.WriteFiles(p.dir, "server"); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	for _, f := range []string{p.serverFiles.CertFile, p.serverFiles.KeyFile} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	cur, _, err := p.serverFiles.Current()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"agent", "agent-rotated"}, []string{old.Leaf.Subject.CommonName, cur.Leaf.Subject.CommonName}); diff != "" {
		t.Errorf("common names before/after rotation (-want +got):\n%s", diff)
	}

	// A broken rotation keeps the last good pair and reports the error.
	if err := os.WriteFile(p.serverFiles.CertFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	kept, _, err := p.serverFiles.Current()
	if err == nil {
		t.Fatal("Current after a broken rotation: no error")
	}
	if kept == nil || kept.Leaf.Subject.CommonName != "agent-rotated" {
		t.Errorf("Current after a broken rotation kept %v, want the last good pair", kept)
	}
	if err := p.serverFiles.Check(time.Now()); err == nil {
		t.Error("Check after a broken rotation: no error")
	}
}
