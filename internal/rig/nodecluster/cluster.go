//go:build linux

// Package nodecluster runs a one-node Kubernetes cluster on this machine (Linux only: kubelet, containerd and runc) for
// tests and trials: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, containerd (with runc and a bridge CNI), kubelet and
// kube-proxy in nftables mode, all as host processes, with images imported
// from archives (nothing is pulled). Unlike bashtask-local, pods really run:
// the operator is installed from its Helm chart as users install it.
// StartRegistry runs a registry inside the cluster (registry.go), from
// which the agent pulls the task images.
//
// Up starts the processes in their own sessions and returns; they outlive
// the caller. Down, from the same or another process, stops them through
// their records in the cluster directory and undoes what they changed on
// the host (mounts, cgroups, nftables tables, sysctls, directories), so Up
// works again. Both need root.
package nodecluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options configure a cluster. Zero values take the defaults of
// DefaultOptions.
type Options struct {
	// Dir holds the cluster's state: certificates, kubeconfigs, the
	// configuration files, etcd's data, containerd's root, pid records and
	// logs/. The admin kubeconfig is Dir/kubeconfig.
	Dir string
	// RunDir holds sockets and runtime state (kept short: a unix socket
	// path is limited to 107 bytes).
	RunDir string
	// BinDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler, kubelet, kube-proxy and kubectl
	// (hack/setup-envtest.sh --node).
	BinDir string
	// CNIBinDir holds the CNI plugins (Debian's containernetworking-plugins).
	CNIBinDir string
	// NodeName is the Node's name.
	NodeName string
	// NodeIP is the node's address, put on lo; the API server listens on
	// it (port 6443) so pods can reach it through the `kubernetes` Service.
	NodeIP string
	// PodCIDR is the bridge network's range; ServiceCIDR the Services'.
	PodCIDR, ServiceCIDR string
	// Bridge is the name of the pods' bridge (at most 15 bytes).
	Bridge string
	// EtcdPort is etcd's client port on 127.0.0.1 (the peer port is the
	// next one).
	EtcdPort int
	// SandboxImage is the pod sandbox (pause) image; it must be in Images.
	SandboxImage string
	// Images are image archives (docker-archive tar files) imported into
	// containerd's k8s.io namespace before kubelet starts.
	Images []Image
	// Log receives progress lines; nil means os.Stderr.
	Log io.Writer
}

// Image is an image archive and the reference it carries.
type Image struct {
	// Ref is the image's name as kubelet asks for it.
	Ref string
	// Archive is the path of a docker-archive tar file.
	Archive string
}

// DefaultOptions returns the defaults for a cluster in dir with binaries in
// binDir. The addresses are private ranges that exist only on this host:
// the node address on lo, pods on the bridge, Services as nftables rules.
func DefaultOptions(dir, binDir string) Options {
	return Options{
		Dir:         dir,
		RunDir:      "/run/bashtask-cluster",
		BinDir:      binDir,
		CNIBinDir:   "/usr/lib/cni",
		NodeName:    "bashtask-node",
		NodeIP:      "10.245.0.1",
		PodCIDR:     "10.244.0.0/16",
		ServiceCIDR: "10.96.0.0/16",
		Bridge:      "bashtask-cni0",
		EtcdPort:    12379,
	}
}

// Cluster is a one-node cluster described by its options; the processes it
// describes may or may not be running.
type Cluster struct {
	opts Options
}

// New returns the cluster that opts describe. It starts nothing.
func New(opts Options) (*Cluster, error) {
	def := DefaultOptions(opts.Dir, opts.BinDir)
	if opts.Dir == "" || opts.BinDir == "" {
		return nil, errors.New("nodecluster: Dir and BinDir are required")
	}
	for _, f := range []struct {
		dst *string
		def string
	}{
		{&opts.RunDir, def.RunDir}, {&opts.CNIBinDir, def.CNIBinDir}, {&opts.NodeName, def.NodeName},
		{&opts.NodeIP, def.NodeIP}, {&opts.PodCIDR, def.PodCIDR}, {&opts.ServiceCIDR, def.ServiceCIDR},
		{&opts.Bridge, def.Bridge},
	} {
		if *f.dst == "" {
			*f.dst = f.def
		}
	}
	if opts.EtcdPort == 0 {
		opts.EtcdPort = def.EtcdPort
	}
	if opts.Log == nil {
		opts.Log = os.Stderr
	}
	var err error
	if opts.Dir, err = filepath.Abs(opts.Dir); err != nil {
		return nil, err
	}
	if opts.BinDir, err = filepath.Abs(opts.BinDir); err != nil {
		return nil, err
	}
	if len(opts.Bridge) > 15 {
		return nil, fmt.Errorf("nodecluster: bridge name %q is longer than 15 bytes (IFNAMSIZ-1)", opts.Bridge)
	}
	if ip := net.ParseIP(opts.NodeIP); ip == nil || ip.To4() == nil || ip.IsLoopback() {
		// kube-apiserver refuses a loopback advertise address.
		return nil, fmt.Errorf("nodecluster: NodeIP %q must be an IPv4 address outside 127.0.0.0/8", opts.NodeIP)
	}
	return &Cluster{opts: opts}, nil
}

// Kubeconfig is the path of the administrator's kubeconfig.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.opts.Dir, "kubeconfig") }

// NodeIP returns the node's address (Options.NodeIP): pods reach the host
// on it.
func (c *Cluster) NodeIP() string { return c.opts.NodeIP }

// APIServerURL is the API server's address.
func (c *Cluster) APIServerURL() string { return "https://" + net.JoinHostPort(c.opts.NodeIP, "6443") }

// ContainerdSocket is the path of the cluster's containerd socket.
func (c *Cluster) ContainerdSocket() string { return filepath.Join(c.opts.RunDir, "containerd.sock") }

// NodeName is the name of the cluster's only Node.
func (c *Cluster) NodeName() string { return c.opts.NodeName }

// components lists the processes in start order; Down stops them in
// reverse.
func (c *Cluster) components() []component {
	bin := func(n string) string { return filepath.Join(c.opts.BinDir, n) }
	pki := c.pkiDir()
	etcdData := filepath.Join(c.opts.Dir, "etcd")
	return []component{
		{name: "etcd", bin: bin("etcd"), args: []string{
			"--data-dir=" + etcdData, "--name=bashtask-node",
			fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", c.opts.EtcdPort),
			fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", c.opts.EtcdPort),
			fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", c.opts.EtcdPort+1),
			fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", c.opts.EtcdPort+1),
			fmt.Sprintf("--initial-cluster=bashtask-node=http://127.0.0.1:%d", c.opts.EtcdPort+1),
			"--unsafe-no-fsync",
		}},
		{name: "kube-apiserver", bin: bin("kube-apiserver"), args: []string{
			fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.opts.EtcdPort),
			// Bound to the node's address, not 127.0.0.1: pods reach the
			// API server through the kubernetes Service, whose endpoint is
			// this address.
			"--bind-address=" + c.opts.NodeIP, "--advertise-address=" + c.opts.NodeIP, "--secure-port=6443",
			"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
			"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + filepath.Join(pki, "sa.pub"),
			"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
			"--service-cluster-ip-range=" + c.opts.ServiceCIDR,
			"--authorization-mode=Node,RBAC",
			"--allow-privileged=true",
			"--kubelet-client-certificate=" + filepath.Join(pki, "apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + filepath.Join(pki, "apiserver-kubelet-client.key"),
			// The Node's name does not resolve; logs and exec go to its
			// InternalIP.
			"--kubelet-preferred-address-types=InternalIP,Hostname",
			"--endpoint-reconciler-type=lease",
			// The aggregation layer (the chart's APIService
			// v1alpha1.output.bashtask.dev): kube-apiserver proxies a
			// request to an extension API server with the front proxy's
			// client certificate and the user in these headers, and
			// publishes the CA and allowed names in
			// kube-system/extension-apiserver-authentication for the
			// servers' delegated authentication. It dials the Service's
			// ClusterIP (no --enable-aggregator-routing): kube-proxy's
			// nftables rules translate the host's own connections too.
			"--requestheader-client-ca-file=" + filepath.Join(pki, "front-proxy-ca.crt"),
			"--requestheader-allowed-names=" + frontProxyClientName,
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + filepath.Join(pki, frontProxyClientName+".crt"),
			"--proxy-client-key-file=" + filepath.Join(pki, frontProxyClientName+".key"),
		}},
		{name: "containerd", bin: "containerd", args: []string{"--config", filepath.Join(c.opts.Dir, "containerd", "config.toml")}},
		{name: "kube-controller-manager", bin: bin("kube-controller-manager"), args: []string{
			"--kubeconfig=" + filepath.Join(c.opts.Dir, "kube-controller-manager.kubeconfig"),
			"--bind-address=127.0.0.1", "--leader-elect=false",
			"--service-account-private-key-file=" + filepath.Join(pki, "sa.key"),
			"--root-ca-file=" + filepath.Join(pki, "ca.crt"),
			// Each controller acts with its own service account and the
			// bootstrap system:controller:* roles, as in kubeadm clusters.
			"--use-service-account-credentials=true",
			"--service-cluster-ip-range=" + c.opts.ServiceCIDR,
			"--cluster-cidr=" + c.opts.PodCIDR,
		}},
		{name: "kube-scheduler", bin: bin("kube-scheduler"), args: []string{
			"--kubeconfig=" + filepath.Join(c.opts.Dir, "kube-scheduler.kubeconfig"),
			"--bind-address=127.0.0.1", "--leader-elect=false",
		}},
		{name: "kubelet", bin: bin("kubelet"), args: []string{
			"--config=" + filepath.Join(c.opts.Dir, "kubelet.yaml"),
			"--kubeconfig=" + filepath.Join(c.opts.Dir, "kubelet.kubeconfig"),
			"--hostname-override=" + c.opts.NodeName,
			"--node-ip=" + c.opts.NodeIP,
		}},
		{name: "kube-proxy", bin: bin("kube-proxy"), args: []string{"--config=" + filepath.Join(c.opts.Dir, "kube-proxy.yaml")}},
	}
}

// Running reports whether any of the cluster's processes is alive.
func (c *Cluster) Running() bool {
	for _, p := range c.components() {
		if c.running(p.name) {
			return true
		}
	}
	return false
}

// ErrAlreadyUp is returned (wrapped) by CheckNotUp and Up when a cluster
// runs, or was not taken down, on this machine.
var ErrAlreadyUp = errors.New("a one-node cluster is already up on this machine")

// CheckNotUp returns ErrAlreadyUp, saying where, when this cluster's
// processes run, its directory records a cluster that was not taken down,
// or another cluster's containerd answers on RunDir's socket (one node per
// machine: kubelet's directories, ports and the kubepods cgroups are the
// host's). It changes nothing.
func (c *Cluster) CheckNotUp() error {
	if c.Running() {
		return fmt.Errorf("%w: its processes run from %s; stop it first (make cluster-down)", ErrAlreadyUp, c.opts.Dir)
	}
	if _, err := os.Stat(c.hostStateFile()); err == nil {
		return fmt.Errorf("%w: %s records a cluster that was not taken down; run make cluster-down first", ErrAlreadyUp, c.hostStateFile())
	}
	// A socket that answers is another directory's live containerd; one
	// that does not is left by a cluster whose processes were killed, and
	// Up starts over it.
	if conn, err := net.DialTimeout("unix", c.ContainerdSocket(), time.Second); err == nil {
		_ = conn.Close()
		return fmt.Errorf("%w: %s answers, so a cluster of another directory runs; take that one down first", ErrAlreadyUp, c.ContainerdSocket())
	}
	return nil
}

// Up starts the cluster and waits until the Node is Ready and the default
// ServiceAccount exists. It refuses to start over a running cluster (Down
// first; the error then wraps ErrAlreadyUp and nothing was touched). On
// any other error it leaves everything it started for the caller to
// inspect (WriteLogTails, Diagnose) and remove with Down.
func (c *Cluster) Up(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("nodecluster: a node (kubelet, containerd, nftables) needs root")
	}
	if err := c.checkTools(); err != nil {
		return err
	}
	if err := c.CheckNotUp(); err != nil {
		return err
	}
	begin := time.Now()
	for _, d := range []string{c.opts.Dir, c.opts.RunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	h, err := c.recordHost()
	if err != nil {
		return fmt.Errorf("recording the host's state: %w", err)
	}
	if err := c.addNodeAddress(h); err != nil {
		return err
	}
	if err := c.writePKI(); err != nil {
		return fmt.Errorf("writing certificates and kubeconfigs: %w", err)
	}
	if err := c.writeConfigs(); err != nil {
		return fmt.Errorf("writing the configuration files: %w", err)
	}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"containerd", c.startContainerd},
		{"kube-controller-manager", c.startSimple("kube-controller-manager")},
		{"kube-scheduler", c.startSimple("kube-scheduler")},
		{"kubelet", c.startKubelet},
		{"kube-proxy", c.startSimple("kube-proxy")},
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("starting %s: %w", s.name, err)
		}
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	if err := c.waitFor(ctx, "Node "+c.opts.NodeName+" Ready", "kubelet", 3*time.Minute, func(ctx context.Context) error {
		return nodeReady(ctx, cs, c.opts.NodeName)
	}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "the default ServiceAccount", "kube-controller-manager", time.Minute, func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(c.opts.Log, "cluster: node %s Ready in %.1fs\n", c.opts.NodeName, time.Since(begin).Seconds())
	return nil
}

func (c *Cluster) component(name string) component {
	for _, p := range c.components() {
		if p.name == name {
			return p
		}
	}
	panic("nodecluster: no component " + name)
}

func (c *Cluster) startSimple(name string) func(context.Context) error {
	return func(context.Context) error { return c.start(c.component(name)) }
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	if err := c.start(c.component("etcd")); err != nil {
		return err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/health", c.opts.EtcdPort)
	return c.waitFor(ctx, "etcd health", "etcd", time.Minute, func(ctx context.Context) error { return httpOK(ctx, http.DefaultClient, url) })
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	if err := c.start(c.component("kube-apiserver")); err != nil {
		return err
	}
	cfg, err := c.RESTConfig()
	if err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	return c.waitFor(ctx, "kube-apiserver /readyz", "kube-apiserver", 2*time.Minute, func(ctx context.Context) error {
		return httpOK(ctx, hc, c.APIServerURL()+"/readyz")
	})
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	if err := c.start(c.component("containerd")); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd socket", "containerd", time.Minute, func(ctx context.Context) error {
		return exec.CommandContext(ctx, "ctr", "--address", c.ContainerdSocket(), "version").Run()
	}); err != nil {
		return err
	}
	for _, img := range c.opts.Images {
		begin := time.Now()
		out, err := exec.CommandContext(ctx, "ctr", "--address", c.ContainerdSocket(), "-n", "k8s.io", "images", "import", img.Archive).CombinedOutput()
		if err != nil {
			return fmt.Errorf("importing %s from %s: %w: %s", img.Ref, img.Archive, err, out)
		}
		fmt.Fprintf(c.opts.Log, "cluster: imported %s in %.1fs\n", img.Ref, time.Since(begin).Seconds())
	}
	return nil
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	return c.start(c.component("kubelet"))
}

// checkTools fails naming every host program the node needs that is
// missing, and the Debian package that has it.
func (c *Cluster) checkTools() error {
	var missing []string
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"} {
		if _, err := os.Stat(filepath.Join(c.opts.BinDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s (hack/setup-envtest.sh --node)", filepath.Join(c.opts.BinDir, b)))
		}
	}
	path := os.Getenv("PATH") + ":/usr/local/sbin:/usr/sbin:/sbin"
	for _, t := range []struct{ bin, pkg string }{
		{"containerd", "containerd"}, {"containerd-shim-runc-v2", "containerd"}, {"ctr", "containerd"},
		{"runc", "runc"}, {"nft", "nftables"}, {"iptables", "iptables"}, {"conntrack", "conntrack"}, {"ip", "iproute2"},
	} {
		if !inPath(t.bin, path) {
			missing = append(missing, fmt.Sprintf("%s (apt-get install %s)", t.bin, t.pkg))
		}
	}
	if _, err := os.Stat(filepath.Join(c.opts.CNIBinDir, "bridge")); err != nil {
		missing = append(missing, fmt.Sprintf("%s/bridge (apt-get install containernetworking-plugins)", c.opts.CNIBinDir))
	}
	if len(missing) > 0 {
		return fmt.Errorf("nodecluster: missing %s", strings.Join(missing, ", "))
	}
	return nil
}

func inPath(bin, path string) bool {
	for d := range strings.SplitSeq(path, ":") {
		if fi, err := os.Stat(filepath.Join(d, bin)); err == nil && !fi.IsDir() {
			return true
		}
	}
	return false
}

// Down stops every process of the cluster (kube-proxy and kubelet first,
// then the pods' processes and containerd, then the control plane) and
// undoes what they changed on the host. It removes the state in Dir but
// keeps logs/. It goes on after errors and returns them all.
func (c *Cluster) Down() error {
	begin := time.Now()
	if _, err := os.Stat(c.hostStateFile()); errors.Is(err, os.ErrNotExist) && !c.Running() {
		fmt.Fprintf(c.opts.Log, "cluster: nothing to take down in %s\n", c.opts.Dir)
		return nil
	}
	var errs []error
	comps := c.components()
	for i := len(comps) - 1; i >= 0; i-- {
		name := comps[i].name
		if name == "containerd" {
			// The pods' processes first: containerd's shims keep them
			// running after containerd ends.
			killCgroupTrees("kubepods")
		}
		if !c.running(name) {
			_ = os.Remove(c.pidFile(name))
			continue
		}
		if c.stop(name, 15*time.Second) {
			fmt.Fprintf(c.opts.Log, "cluster: %s did not stop in 15s; killed\n", name)
		} else {
			fmt.Fprintf(c.opts.Log, "cluster: stopped %s\n", name)
		}
	}
	if h, err := c.loadHost(); err == nil {
		if err := c.restoreHost(h); err != nil {
			errs = append(errs, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.opts.RunDir); err != nil {
		errs = append(errs, err)
	}
	entries, _ := os.ReadDir(c.opts.Dir)
	for _, e := range entries {
		if e.Name() == "logs" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.opts.Dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	fmt.Fprintf(c.opts.Log, "cluster: down in %.1fs\n", time.Since(begin).Seconds())
	return errors.Join(errs...)
}

// RESTConfig is the administrator's client configuration.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", c.Kubeconfig(), err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// Clientset is a client-go clientset for the administrator.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func nodeReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s not registered yet", name)
	}
	if err != nil {
		return err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			if cond.Status == corev1.ConditionTrue {
				return nil
			}
			return fmt.Errorf("node %s: Ready=%s %s: %s", name, cond.Status, cond.Reason, cond.Message)
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", name)
}

func httpOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}
