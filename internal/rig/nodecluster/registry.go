//go:build linux

package nodecluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The in-cluster registry (docs/images.md, "Images on the machine"): a
// Deployment of the registry image of internal/rig/nodeimages in its own
// namespace, its blobs in an emptyDir, behind a Service whose ClusterIP is
// fixed, so that the references of the images pushed to it stay valid for
// as long as the cluster is up and can go into the chart's values before
// the Service exists.
const (
	// RegistryNamespace is the namespace of the registry's Deployment
	// and Service (both named "registry").
	RegistryNamespace = "bashtask-registry"
	// RegistryPort is the Service's and the registry's port.
	RegistryPort = 5000
	// registryIPOffset is the ClusterIP's offset in the Service range: in
	// its lower band, which the API server leaves to fixed addresses.
	registryIPOffset = 50
)

// RegistryHost is the in-cluster registry's HOST:PORT, the Service's fixed
// ClusterIP (the 50th address of Options.ServiceCIDR) and RegistryPort:
// the first element of the references of its images. Pods reach it
// through kube-proxy's rules, and so does the node's own network
// namespace (pushes from this machine); the kubelet does not use it.
func (c *Cluster) RegistryHost() (string, error) {
	_, cidr, err := net.ParseCIDR(c.opts.ServiceCIDR)
	if err != nil {
		return "", fmt.Errorf("nodecluster: ServiceCIDR %q: %w", c.opts.ServiceCIDR, err)
	}
	ip := cidr.IP.To4()
	if ip == nil {
		return "", fmt.Errorf("nodecluster: ServiceCIDR %q is not IPv4", c.opts.ServiceCIDR)
	}
	ip = net.IPv4(ip[0], ip[1], ip[2], ip[3]+registryIPOffset)
	if !cidr.Contains(ip) {
		return "", fmt.Errorf("nodecluster: ServiceCIDR %q is too small for the registry's address", c.opts.ServiceCIDR)
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(RegistryPort)), nil
}

// registryManifests are the registry's namespace, Deployment and Service
// for the image ref (imported into the node, never pulled) on the
// ClusterIP ip. Repositories under "/private/" want the test credentials
// (registry.GuardPrivateForTest).
func registryManifests(ref, ip string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: registry
  namespace: %[1]s
spec:
  replicas: 1
  selector:
    matchLabels: {app: registry}
  template:
    metadata:
      labels: {app: registry}
    spec:
      automountServiceAccountToken: false
      containers:
        - name: registry
          image: %[2]s
          imagePullPolicy: Never
          args: [-addr=:%[4]d, -dir=/var/lib/registry, -private-basic-auth]
          ports: [{name: http, containerPort: %[4]d}]
          readinessProbe:
            httpGet: {path: /v2/, port: %[4]d}
            periodSeconds: 2
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            runAsNonRoot: true
            capabilities: {drop: [ALL]}
          volumeMounts: [{name: data, mountPath: /var/lib/registry}]
      volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata:
  name: registry
  namespace: %[1]s
spec:
  clusterIP: %[3]s
  selector: {app: registry}
  ports: [{name: http, port: %[4]d, targetPort: %[4]d}]
`, RegistryNamespace, ref, ip, RegistryPort)
}

// StartRegistry deploys the in-cluster registry of the image ref (the
// registry image of internal/rig/nodeimages, in Options.Images) and waits
// up to 2 minutes until its pod is Ready and this machine reaches it at
// RegistryHost.
func (c *Cluster) StartRegistry(ctx context.Context, ref string) error {
	begin := time.Now()
	host, err := c.RegistryHost()
	if err != nil {
		return err
	}
	ip, _, _ := net.SplitHostPort(host)
	if _, err := c.RunInput(ctx, registryManifests(ref, ip), c.kubectlPath(), "apply", "-f", "-"); err != nil {
		return err
	}
	if err := c.WaitReleaseReady(ctx, RegistryNamespace, 2*time.Minute); err != nil {
		return err
	}
	url := "http://" + host + "/v2/"
	if err := c.waitFor(ctx, "the registry at "+url, "kube-proxy", time.Minute, func(ctx context.Context) error {
		return httpOK(ctx, &http.Client{Timeout: 5 * time.Second}, url)
	}); err != nil {
		return err
	}
	fmt.Fprintf(c.opts.Log, "cluster: registry at %s ready in %.1fs\n", host, time.Since(begin).Seconds())
	return nil
}

// PushToRegistry pushes the image of the docker-archive archive, which
// carries the reference ref, to repo:tag of the in-cluster registry, with
// the credentials auth (nil: anonymous), and returns its reference by
// digest (HOST/REPO@sha256:...).
func (c *Cluster) PushToRegistry(ctx context.Context, archive, ref, repo, tag string, auth authn.Authenticator) (string, error) {
	begin := time.Now()
	host, err := c.RegistryHost()
	if err != nil {
		return "", err
	}
	src, err := name.NewTag(ref)
	if err != nil {
		return "", fmt.Errorf("nodecluster: reference %q: %w", ref, err)
	}
	img, err := tarball.ImageFromPath(archive, &src)
	if err != nil {
		return "", fmt.Errorf("nodecluster: reading %s from %s: %w", ref, archive, err)
	}
	dst, err := name.NewTag(host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("nodecluster: reference %s/%s:%s: %w", host, repo, tag, err)
	}
	if auth == nil {
		auth = authn.Anonymous
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
		return "", fmt.Errorf("nodecluster: pushing %s: %w", dst, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("nodecluster: digest of %s: %w", dst, err)
	}
	fmt.Fprintf(c.opts.Log, "cluster: pushed %s in %.1fs\n", dst, time.Since(begin).Seconds())
	return dst.Context().Digest(d.String()).String(), nil
}

// kubectlPath is the cluster's kubectl.
func (c *Cluster) kubectlPath() string { return c.opts.BinDir + "/kubectl" }
