package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// ControllerIdentity is the common name of the controller's client
// certificate, which agents require (their --controller-identity default).
const ControllerIdentity = "bashtask-controller"

// Certs are the PEM files of a local cluster's mTLS, under one directory.
type Certs struct {
	// CAFile is the CA bundle both sides trust.
	CAFile string
	// Agent is the agents' serving key pair, valid for AgentServerName.
	Agent *tlsutil.Files
	// Controller is the controller's client key pair, with the common name
	// ControllerIdentity.
	Controller *tlsutil.Files
	// AgentCertFile, AgentKeyFile, ControllerCertFile and ControllerKeyFile
	// are the file paths, for command-line flags.
	AgentCertFile, AgentKeyFile, ControllerCertFile, ControllerKeyFile string
	// OutputAPIDir holds tls.crt and tls.key, the output API's serving
	// pair for OutputAPIServerName, issued by the CA of CAFile (the
	// APIService's caBundle).
	OutputAPIDir string
	// FrontProxyCAFile is kube-apiserver's --requestheader-client-ca-file,
	// a CA of its own: whoever holds a certificate of it may assert any
	// user to the aggregated servers.
	FrontProxyCAFile string
	// FrontProxyCertFile and FrontProxyKeyFile are kube-apiserver's
	// --proxy-client-cert-file and key, with the common name
	// FrontProxyClientName.
	FrontProxyCertFile, FrontProxyKeyFile string
}

// FrontProxyClientName is the common name of kube-apiserver's front-proxy
// client certificate (--requestheader-allowed-names).
const FrontProxyClientName = "front-proxy-client"

// IssueCerts creates a CA and the two key pairs in dir (mode 0600 files),
// valid for validity. serverName is the DNS name the agents' certificate
// carries, which the controller checks.
func IssueCerts(dir, serverName string, validity time.Duration) (*Certs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the certificate directory: %w", err)
	}
	ca, err := tlsutil.NewCA("bashtask local CA", validity)
	if err != nil {
		return nil, err
	}
	c := &Certs{CAFile: filepath.Join(dir, "ca.crt")}
	if err := tlsutil.WriteFileAtomic(c.CAFile, ca.CertPEM, 0o600); err != nil {
		return nil, err
	}
	agentKP, err := ca.Issue(tlsutil.LeafOptions{CommonName: "bashtask-agent", DNSNames: []string{serverName}, Server: true, Validity: validity})
	if err != nil {
		return nil, err
	}
	if c.AgentCertFile, c.AgentKeyFile, err = agentKP.WriteFiles(dir, "agent"); err != nil {
		return nil, err
	}
	ctrlKP, err := ca.Issue(tlsutil.LeafOptions{CommonName: ControllerIdentity, Client: true, Validity: validity})
	if err != nil {
		return nil, err
	}
	if c.ControllerCertFile, c.ControllerKeyFile, err = ctrlKP.WriteFiles(dir, "controller"); err != nil {
		return nil, err
	}
	c.OutputAPIDir = filepath.Join(dir, "output-api")
	if err := os.MkdirAll(c.OutputAPIDir, 0o700); err != nil {
		return nil, err
	}
	apiKP, err := ca.Issue(tlsutil.LeafOptions{CommonName: OutputAPIService, DNSNames: []string{OutputAPIServerName, "localhost"}, Server: true, Validity: validity})
	if err != nil {
		return nil, err
	}
	if _, _, err = apiKP.WriteFiles(c.OutputAPIDir, "tls"); err != nil {
		return nil, err
	}
	fpCA, err := tlsutil.NewCA("bashtask local front-proxy CA", validity)
	if err != nil {
		return nil, err
	}
	c.FrontProxyCAFile = filepath.Join(dir, "front-proxy-ca.crt")
	if err := tlsutil.WriteFileAtomic(c.FrontProxyCAFile, fpCA.CertPEM, 0o600); err != nil {
		return nil, err
	}
	fpKP, err := fpCA.Issue(tlsutil.LeafOptions{CommonName: FrontProxyClientName, Client: true, Validity: validity})
	if err != nil {
		return nil, err
	}
	if c.FrontProxyCertFile, c.FrontProxyKeyFile, err = fpKP.WriteFiles(dir, "front-proxy-client"); err != nil {
		return nil, err
	}
	if c.Agent, err = tlsutil.NewFiles(c.AgentCertFile, c.AgentKeyFile, c.CAFile); err != nil {
		return nil, err
	}
	if c.Controller, err = tlsutil.NewFiles(c.ControllerCertFile, c.ControllerKeyFile, c.CAFile); err != nil {
		return nil, err
	}
	return c, nil
}
