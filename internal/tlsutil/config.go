package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
)

// ErrWrongIdentity is returned (inside the TLS handshake) when a verified
// peer certificate does not carry the expected identity.
var ErrWrongIdentity = errors.New("peer certificate does not carry the expected identity")

// HasIdentity reports whether cert carries identity: as its subject common
// name, a DNS name or a URI subject alternative name. Accepting the common
// name as well as SANs lets a plain cert-manager Certificate with
// `commonName: bashtask-controller` work without extra fields.
func HasIdentity(cert *x509.Certificate, identity string) bool {
	if identity == "" || cert == nil {
		return false
	}
	if cert.Subject.CommonName == identity || slices.Contains(cert.DNSNames, identity) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == identity {
			return true
		}
	}
	return false
}

// ServerConfig returns a TLS 1.3 server configuration that presents files'
// key pair and accepts only clients whose certificate chains to files' CA
// bundle and carries clientIdentity (see HasIdentity). Both checks run in
// the handshake, so a refused client never reaches an RPC handler. Each
// handshake uses the current files (see Files).
func ServerConfig(files *Files, clientIdentity string) (*tls.Config, error) {
	if clientIdentity == "" {
		return nil, errors.New("tlsutil: empty client identity")
	}
	if _, _, err := files.Current(); err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS13}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool, err := files.Current()
		if cert == nil {
			return nil, fmt.Errorf("server certificate unavailable: %w", err)
		}
		// On a failed reload the last good material keeps serving; the
		// agent's readiness reports the error.
		return &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{*cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
			VerifyConnection: func(cs tls.ConnectionState) error {
				return verifyIdentity(cs, clientIdentity)
			},
		}, nil
	}
	return base, nil
}

// ClientConfig returns a TLS 1.3 client configuration that presents files'
// key pair and accepts only a server whose certificate chains to files' CA
// bundle and is valid for serverName (a DNS name or IP address). The
// controller dials agents with it.
func ClientConfig(files *Files, serverName string) (*tls.Config, error) {
	if serverName == "" {
		return nil, errors.New("tlsutil: empty server name")
	}
	if _, _, err := files.Current(); err != nil {
		return nil, err
	}
	// The roots must come from the current files at every handshake, which
	// RootCAs cannot do, so the chain is verified here; the standard
	// verification is switched off only because this replaces it.
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		ServerName:         serverName,
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection against the current CA.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _, err := files.Current()
			if cert == nil {
				return nil, fmt.Errorf("client certificate unavailable: %w", err)
			}
			return cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool, err := files.Current()
			if pool == nil {
				return fmt.Errorf("CA bundle unavailable: %w", err)
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			opts := x509.VerifyOptions{
				Roots:         pool,
				DNSName:       cs.ServerName,
				Intermediates: x509.NewCertPool(),
				KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("verifying server certificate: %w", err)
			}
			return nil
		},
	}, nil
}

func verifyIdentity(cs tls.ConnectionState, identity string) error {
	// RequireAndVerifyClientCert has already verified the chain against the
	// CA pool (with the client-auth key usage); only the identity is left.
	if len(cs.PeerCertificates) == 0 {
		return errors.New("client sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	if !HasIdentity(leaf, identity) {
		return fmt.Errorf("client %q: %w %q", leaf.Subject.CommonName, ErrWrongIdentity, identity)
	}
	return nil
}
