package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ErrNoCertificates is returned when a CA bundle holds no PEM certificate.
var ErrNoCertificates = errors.New("no certificates in CA bundle")

// Files is a key pair and a CA bundle on disk, re-read when any of the three
// files changes (modification time or size). Kubernetes updates mounted
// Secrets by swapping a symlink, and cert-manager rotates certificates well
// before they expire, so a long-running process must pick up new files
// without a restart; stat-ing on use is cheap next to a handshake and needs
// no watcher goroutine.
//
// A failed reload keeps the last good material and reports the error, so a
// half-written rotation does not cut off working connections. Files is safe
// for concurrent use.
type Files struct {
	// CertFile and KeyFile are the PEM certificate chain and private key.
	CertFile, KeyFile string
	// CAFile is the PEM bundle of the CA certificates peers must chain to.
	CAFile string

	mu      sync.Mutex
	stamp   [3]fileStamp
	cert    *tls.Certificate
	leaf    *x509.Certificate
	pool    *x509.CertPool
	lastErr error
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// NewFiles returns Files for the three paths after loading them once; the
// error says which file is unusable.
func NewFiles(certFile, keyFile, caFile string) (*Files, error) {
	f := &Files{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
	if _, _, err := f.Current(); err != nil {
		return nil, err
	}
	return f, nil
}

// Current returns the key pair and CA pool, reloading them first when a file
// changed. When the reload fails it returns the last good material with the
// error; before the first success the material is nil.
func (f *Files) Current() (*tls.Certificate, *x509.CertPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var now [3]fileStamp
	for i, p := range []string{f.CertFile, f.KeyFile, f.CAFile} {
		st, err := os.Stat(p)
		if err != nil {
			f.lastErr = fmt.Errorf("reading TLS file: %w", err)
			return f.cert, f.pool, f.lastErr
		}
		now[i] = fileStamp{mod: st.ModTime(), size: st.Size()}
	}
	if f.cert != nil && now == f.stamp && f.lastErr == nil {
		return f.cert, f.pool, nil
	}
	cert, leaf, pool, err := load(f.CertFile, f.KeyFile, f.CAFile)
	if err != nil {
		f.lastErr = err
		return f.cert, f.pool, err
	}
	f.cert, f.leaf, f.pool, f.stamp, f.lastErr = cert, leaf, pool, now, nil
	return cert, pool, nil
}

// Check reloads when needed and reports whether the material is usable now:
// loaded, and the leaf certificate valid at now. The agent's readiness uses
// it.
func (f *Files) Check(now time.Time) error {
	if _, _, err := f.Current(); err != nil {
		return err
	}
	f.mu.Lock()
	leaf := f.leaf
	f.mu.Unlock()
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("certificate %s is not valid before %s", f.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(leaf.NotAfter) {
		return fmt.Errorf("certificate %s expired at %s", f.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func load(certFile, keyFile, caFile string) (*tls.Certificate, *x509.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading key pair %s, %s: %w", certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parsing certificate %s: %w", certFile, err)
	}
	cert.Leaf = leaf
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, nil, fmt.Errorf("CA bundle %s: %w", caFile, ErrNoCertificates)
	}
	return &cert, leaf, pool, nil
}
