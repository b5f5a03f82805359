//go:build linux

package nodecluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// certValidity is how long the rig's certificates are valid: a test
// cluster lives for minutes, a kept one for days at most.
const certValidity = 30 * 24 * time.Hour

// identity is one client of the API server: its kubeconfig file name and
// the user and groups its certificate carries (the Kubernetes convention:
// common name is the user, organizations are the groups).
type identity struct {
	file   string
	user   string
	groups []string
}

// writePKI makes the cluster CA, the API server's serving certificate, the
// service-account signing key, the front proxy's CA and client
// certificate, and one client certificate and kubeconfig per component,
// under c.pkiDir() and c.opts.Dir.
func (c *Cluster) writePKI() error {
	dir := c.pkiDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := tlsutil.NewCA("bashtask-cluster-ca", certValidity)
	if err != nil {
		return err
	}
	if err := tlsutil.WriteFileAtomic(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o644); err != nil {
		return err
	}
	server, err := ca.Issue(tlsutil.LeafOptions{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		// The first address of the service range is the `kubernetes`
		// Service's ClusterIP, which pods dial.
		IPs:      []net.IP{net.ParseIP(c.opts.NodeIP), c.apiServiceIP(), net.ParseIP("127.0.0.1")},
		Server:   true,
		Validity: certValidity,
	})
	if err != nil {
		return err
	}
	if _, _, err := server.WriteFiles(dir, "apiserver"); err != nil {
		return err
	}
	if err := writeServiceAccountKey(dir); err != nil {
		return err
	}
	if err := writeFrontProxyPKI(dir); err != nil {
		return err
	}
	kubeletClient, err := ca.Issue(tlsutil.LeafOptions{
		CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"},
		Client: true, Validity: certValidity,
	})
	if err != nil {
		return err
	}
	if _, _, err := kubeletClient.WriteFiles(dir, "apiserver-kubelet-client"); err != nil {
		return err
	}
	ids := []identity{
		{file: "kubeconfig", user: "bashtask-cluster-admin", groups: []string{"system:masters"}},
		{file: "kube-controller-manager.kubeconfig", user: "system:kube-controller-manager"},
		{file: "kube-scheduler.kubeconfig", user: "system:kube-scheduler"},
		{file: "kube-proxy.kubeconfig", user: "system:kube-proxy"},
		{file: "kubelet.kubeconfig", user: "system:node:" + c.opts.NodeName, groups: []string{"system:nodes"}},
	}
	for _, id := range ids {
		kp, err := ca.Issue(tlsutil.LeafOptions{CommonName: id.user, Organization: id.groups, Client: true, Validity: certValidity})
		if err != nil {
			return err
		}
		if err := c.writeKubeconfig(filepath.Join(c.opts.Dir, id.file), ca.CertPEM, kp); err != nil {
			return err
		}
	}
	return nil
}

// frontProxyClientName is the common name of the certificate kube-apiserver
// presents when it proxies a request to an aggregated API server
// (--proxy-client-cert-file), and the only name such servers accept
// (--requestheader-allowed-names), as in kubeadm clusters.
const frontProxyClientName = "front-proxy-client"

// writeFrontProxyPKI writes the front proxy's CA (front-proxy-ca.crt, for
// --requestheader-client-ca-file) and the client certificate signed by it
// (front-proxy-client.crt and .key). A CA of its own, as kubeadm makes,
// so that no certificate of the cluster CA can pass a user name in the
// X-Remote-User header of a request to an aggregated API server: those
// servers trust the headers of a client whose certificate this CA signed.
func writeFrontProxyPKI(dir string) error {
	ca, err := tlsutil.NewCA("bashtask-front-proxy-ca", certValidity)
	if err != nil {
		return err
	}
	if err := tlsutil.WriteFileAtomic(filepath.Join(dir, "front-proxy-ca.crt"), ca.CertPEM, 0o644); err != nil {
		return err
	}
	client, err := ca.Issue(tlsutil.LeafOptions{CommonName: frontProxyClientName, Client: true, Validity: certValidity})
	if err != nil {
		return err
	}
	_, _, err = client.WriteFiles(dir, frontProxyClientName)
	return err
}

// apiServiceIP is the `kubernetes` Service's ClusterIP: the first address
// of the service range (what kube-apiserver allocates to it).
func (c *Cluster) apiServiceIP() net.IP {
	_, n, err := net.ParseCIDR(c.opts.ServiceCIDR)
	if err != nil {
		return nil
	}
	ip := n.IP.To4()
	if ip == nil {
		return nil
	}
	out := make(net.IP, len(ip))
	copy(out, ip)
	out[3]++
	return out
}

// writeServiceAccountKey writes the ECDSA key that signs service-account
// tokens (sa.key, for kube-apiserver and kube-controller-manager) and its
// public half (sa.pub, which kube-apiserver verifies tokens with).
func writeServiceAccountKey(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating the service-account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding the service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("encoding the service-account public key: %w", err)
	}
	if err := tlsutil.WriteFileAtomic(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return tlsutil.WriteFileAtomic(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// writeKubeconfig writes a kubeconfig for the API server at the node's
// address with the client certificate kp embedded.
func (c *Cluster) writeKubeconfig(path string, caPEM []byte, kp tlsutil.KeyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["bashtask-cluster"] = &clientcmdapi.Cluster{Server: c.APIServerURL(), CertificateAuthorityData: caPEM}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts["bashtask-cluster"] = &clientcmdapi.Context{Cluster: "bashtask-cluster", AuthInfo: "user"}
	cfg.CurrentContext = "bashtask-cluster"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return tlsutil.WriteFileAtomic(path, data, 0o600)
}
