//go:build linux

package nodecluster

import (
	"fmt"
	"os"
	"path/filepath"
)

// The configuration files of the node's components. Each setting that is
// not a plain default says why; REAL-NODE findings are marked as such in
// docs/development.md.

// containerdConfig is containerd 1.6's configuration (version 2 schema) for
// an instance of its own: root, state, socket and runc root apart from any
// containerd of the host, and a sandbox image that is already imported, so
// nothing is pulled.
func (c *Cluster) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # These hosts deny CAP_SYS_RESOURCE even to root, so runc cannot set a
  # negative oom_score_adj; without this every pod sandbox fails to start.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(c.opts.Dir, "containerd", "root"), filepath.Join(c.opts.RunDir, "containerd"),
		c.ContainerdSocket(), filepath.Join(c.opts.Dir, "containerd", "opt"),
		c.opts.SandboxImage, filepath.Join(c.opts.RunDir, "runc"),
		c.opts.CNIBinDir, c.cniConfDir())
}

// cniConflist is a bridge network for the pods with host-local addresses
// and port mappings. ipMasq is off: pods talk to the node and to each other
// only.
func (c *Cluster) cniConflist() string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "bashtask-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, c.opts.Bridge, filepath.Join(c.opts.Dir, "cni", "ipam"), c.opts.PodCIDR)
}

// kubeletConfig is the kubelet's configuration file.
func (c *Cluster) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These hosts mount cgroup v1 (with v2 at /sys/fs/cgroup/unified); kubelet
# 1.37 refuses v1 unless told otherwise. Test rig only.
failCgroupV1: false
# containerd 1.6 cannot tell kubelet its cgroup driver.
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# The API server's logs, exec and port-forward calls authenticate with a
# client certificate of the cluster CA; anything else is let in anonymously
# and allowed. Test rig only: a real node uses webhook authorization.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
  x509:
    clientCAFile: %s
authorization:
  mode: AlwaysAllow
# No cluster DNS: the operator dials the API server and the agents by
# address (the kubernetes Service's ClusterIP and the EndpointSlices).
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
staticPodPath: ""
# Evictions and image garbage collection would remove the imported images
# or the agent on a nearly full test disk; nothing here is pulled again.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, c.ContainerdSocket(), c.opts.NodeIP, filepath.Join(c.pkiDir(), "ca.crt"))
}

// kubeProxyConfig is kube-proxy's configuration: nftables mode, and
// conntrack settings of zero so it leaves the host's conntrack sysctls as
// they are.
func (c *Cluster) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
bindAddress: %s
healthzBindAddress: %s:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["%s/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, filepath.Join(c.opts.Dir, "kube-proxy.kubeconfig"), c.opts.NodeName, c.opts.PodCIDR, c.opts.NodeIP, c.opts.NodeIP, c.opts.NodeIP)
}

// writeConfigs writes every configuration file above.
func (c *Cluster) writeConfigs() error {
	files := map[string]string{
		filepath.Join(c.opts.Dir, "containerd", "config.toml"): c.containerdConfig(),
		filepath.Join(c.cniConfDir(), "10-bashtask.conflist"):  c.cniConflist(),
		filepath.Join(c.opts.Dir, "kubelet.yaml"):              c.kubeletConfig(),
		filepath.Join(c.opts.Dir, "kube-proxy.yaml"):           c.kubeProxyConfig(),
	}
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) cniConfDir() string { return filepath.Join(c.opts.Dir, "cni", "net.d") }
func (c *Cluster) pkiDir() string     { return filepath.Join(c.opts.Dir, "pki") }
