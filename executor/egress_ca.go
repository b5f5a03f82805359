package executor

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"sync"
	"time"
)

// Lifetimes of a workspace CA's certificates (docs/egress.md).
const (
	// egressCAValidity is how long a workspace CA's certificate is valid;
	// the CA lives in the agent's memory, so a restarted agent makes a
	// new one anyway.
	egressCAValidity = 365 * 24 * time.Hour
	// egressLeafValidity is how long a leaf certificate for an
	// intercepted name is valid; it is made again when less than
	// egressLeafRenew is left.
	egressLeafValidity = 7 * 24 * time.Hour
	egressLeafRenew    = 24 * time.Hour
)

// egressCA is a workspace's certificate authority: an ECDSA P-256 key
// that never leaves the agent's memory and its self-signed certificate,
// which the workspace's tasks trust. It signs a leaf certificate per
// intercepted name, cached.
type egressCA struct {
	key     *ecdsa.PrivateKey
	cert    *x509.Certificate
	certPEM []byte
	leafKey *ecdsa.PrivateKey // one key for every leaf of the CA

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// newEgressCA makes a CA named after the workspace's link.
func newEgressCA(name string) (*egressCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"bashtask"}, CommonName: "bashtask egress CA " + name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(egressCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &egressCA{key: key, leafKey: leafKey, cert: cert, leaves: map[string]*tls.Certificate{},
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// leaf is the certificate for name (lower case) signed by the CA, made
// on first use and when it nears its end.
func (ca *egressCA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[name]; c != nil && time.Until(c.Leaf.NotAfter) > egressLeafRenew {
		return c, nil
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(egressLeafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	ca.leaves[name] = c
	return c, nil
}

// SystemCABundles are the files, in order, whose first existing one is
// the node's trust store that a workspace's bundle starts with (Debian and
// Ubuntu, Fedora and RHEL, openSUSE, Alpine and others); the agent's
// SSL_CERT_FILE comes first when set.
var SystemCABundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// trustBundle is the node's trust store followed by the CA's
// certificate; with no trust store found, the CA's certificate alone.
func (ca *egressCA) trustBundle() []byte {
	files := SystemCABundles
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		files = append([]string{f}, files...)
	}
	var b bytes.Buffer
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err == nil {
			b.Write(data)
			if !bytes.HasSuffix(data, []byte("\n")) {
				b.WriteByte('\n')
			}
			break
		}
	}
	fmt.Fprintf(&b, "# bashtask egress CA of this workspace (docs/egress.md)\n")
	b.Write(ca.certPEM)
	return b.Bytes()
}

// TrustEnvNames are the variables a workspace task with injection rules
// gets, each naming the workspace's trust bundle: OpenSSL and Go
// (SSL_CERT_FILE), Python requests, Node.js, curl, git and pip.
var TrustEnvNames = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT"}

// trustEnv are the variables of TrustEnvNames set to path.
func trustEnv(path string) []EnvVar {
	out := make([]EnvVar, 0, len(TrustEnvNames))
	for _, n := range TrustEnvNames {
		out = append(out, EnvVar{Name: n, Value: path})
	}
	return out
}

// errNotTLS is the peek's error for a connection that did not start with
// a TLS ClientHello.
var errNotTLS = errors.New("not a TLS ClientHello")
