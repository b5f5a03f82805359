package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority held in memory, for tests and the local
// launcher; clusters use cert-manager or their own PKI instead.
type CA struct {
	// Cert is the CA certificate.
	Cert *x509.Certificate
	// CertPEM is Cert in PEM form, the content of a CA bundle.
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// LeafOptions describe a certificate issued by a CA.
type LeafOptions struct {
	// CommonName is the subject common name; for a client it is the
	// identity the agent checks (see HasIdentity).
	CommonName string
	// Organization is the subject's organizations; Kubernetes reads them
	// as the groups of a client certificate's user (system:masters,
	// system:nodes).
	Organization []string
	// DNSNames and IPs are the subject alternative names a server is
	// valid for.
	DNSNames []string
	IPs      []net.IP
	// Server and Client select the extended key usages serverAuth and
	// clientAuth; at least one must be true.
	Server, Client bool
	// Validity is how long the certificate is valid from now (minus a
	// minute of clock-skew allowance); zero means 24 hours.
	Validity time.Duration
}

// KeyPair is a certificate and its private key in PEM form.
type KeyPair struct {
	CertPEM, KeyPEM []byte
}

// NewCA creates a self-signed ECDSA P-256 CA named commonName, valid for
// validity (zero means 24 hours).
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl, err := template(commonName, validity)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}, nil
}

// Issue creates an ECDSA P-256 leaf certificate signed by ca.
func (ca *CA) Issue(o LeafOptions) (KeyPair, error) {
	if !o.Server && !o.Client {
		return KeyPair{}, fmt.Errorf("issuing %q: neither server nor client usage", o.CommonName)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generating key for %q: %w", o.CommonName, err)
	}
	tmpl, err := template(o.CommonName, o.Validity)
	if err != nil {
		return KeyPair{}, err
	}
	tmpl.Subject.Organization = o.Organization
	tmpl.DNSNames, tmpl.IPAddresses = o.DNSNames, o.IPs
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if o.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if o.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("issuing %q: %w", o.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("encoding key of %q: %w", o.CommonName, err)
	}
	return KeyPair{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}, nil
}

// WriteFiles writes the key pair to dir/<name>.crt and dir/<name>.key (mode
// 0600, replaced atomically so a reloading reader never sees half a file)
// and returns the two paths.
func (kp KeyPair) WriteFiles(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := WriteFileAtomic(keyFile, kp.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := WriteFileAtomic(certFile, kp.CertPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteFileAtomic writes data to a temporary file next to path and renames
// it over path.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func template(commonName string, validity time.Duration) (*x509.Certificate, error) {
	if validity == 0 {
		validity = 24 * time.Hour
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
	}, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
