// Package kubectl is the kubectl phase of hack/bench (make
// bench-cluster-interactive, docs/performance.md, "Terminal and
// port-forward against kubectl"): on the one-node cluster of make
// cluster-up (a real kubelet, containerd and runc), the terminal and the
// port-forward of a workspace side by side with kubectl exec -it and
// kubectl port-forward to a pod on the same node, in one run:
//
//   - keystroke echo (the terminal phase's Echo): the Go client's Attach
//     to a task with spec.tty, and client-go's exec executor with a TTY
//     (WebSocket, falling back to SPDY: what kubectl exec -it runs) into
//     the pod, each running `cat > /dev/null`;
//   - 1 GiB through one forwarded connection and small HTTP GETs, kept
//     and new connections (the portforward phase's measurements): the Go
//     client's PortForward to a workspace, and the kubectl binary's
//     port-forward to the pod, both to the same Python server
//     (portforward.ServerScript).
//
// The pod runs in the Task image, imported into the node's containerd
// from bin/images (make cluster-up builds it); the workspace's task runs
// in the chart's default image, the same image pulled from the in-cluster
// registry. The phase does not start a cluster: it fails naming make
// cluster-up when the kubeconfig is missing.
package kubectl

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/portforward"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/terminal"
)

// namespace is the phase's namespace on the cluster.
const namespace = "bench-kubectl"

type options struct {
	kubeconfig, kubectl      string
	imageArchive, containerd string
	keys, warmup             int
	bytes                    int64
	requests, concurrency    int
	timeout                  time.Duration
}

// Phase is the kubectl phase.
type Phase struct{ o options }

// Name implements phase.Phase.
func (*Phase) Name() string { return "kubectl" }

// Flags implements phase.Phase.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.StringVar(&p.o.kubeconfig, "kubeconfig", ".bashtask/cluster/kubeconfig", "the one-node cluster's kubeconfig (make cluster-up)")
	fs.StringVar(&p.o.kubectl, "kubectl", "bin/k8s/kubectl", "the kubectl binary whose port-forward is measured")
	fs.StringVar(&p.o.imageArchive, "image-archive", "bin/images/bashtask-task.tar", "the Task image's archive, imported into the node's containerd for the pod")
	fs.StringVar(&p.o.containerd, "containerd", "/run/bashtask-cluster/containerd.sock", "the node's containerd socket")
	fs.IntVar(&p.o.keys, "keys", 500, "timed keystrokes through each terminal, one at a time")
	fs.IntVar(&p.o.warmup, "warmup", 20, "untimed keystrokes before the timed ones")
	fs.Int64Var(&p.o.bytes, "bytes", 1<<30, "bytes carried through one forwarded connection of each port-forward")
	fs.IntVar(&p.o.requests, "requests", 2000, "small HTTP GETs on kept connections through each port-forward (a tenth as many on new connections)")
	fs.IntVar(&p.o.concurrency, "concurrency", 8, "HTTP GETs in flight at once")
	fs.DurationVar(&p.o.timeout, "timeout", 3*time.Minute, "limit of each start (pod, workspace, server, forward) and of one echo")
}

// Run implements phase.Phase.
func (p *Phase) Run(ctx context.Context, _ *phase.Env) (phase.Figures, error) {
	if _, err := os.Stat(p.o.kubeconfig); err != nil {
		return nil, fmt.Errorf("the one-node cluster's kubeconfig: %w (start the cluster with make cluster-up)", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", p.o.kubeconfig)
	if err != nil {
		return nil, err
	}
	k8s, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	oc, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	t := &targets{o: p.o, cfg: cfg, k8s: k8s, cs: cs, oc: oc}
	defer t.cleanup()
	if err := t.setup(ctx); err != nil {
		return nil, err
	}
	r, err := t.measure(ctx)
	if err != nil {
		return nil, err
	}
	return r.print(p.o), nil
}

// measure takes each figure through both ways, one after the other.
func (t *targets) measure(ctx context.Context) (*results, error) {
	var r results
	eo := terminal.EchoOptions{Keys: t.o.keys, Warmup: t.o.warmup, Timeout: t.o.timeout}
	var err error
	if r.echo[0], err = terminal.Echo(ctx, eo, t.attachTask); err != nil {
		return nil, fmt.Errorf("echo through bashtasks/attach: %w", err)
	}
	if r.echo[1], err = terminal.Echo(ctx, eo, t.execPod); err != nil {
		return nil, fmt.Errorf("echo through pods/exec: %w", err)
	}
	for i, forward := range []func(context.Context) ([]uint16, <-chan error, error){t.forwardWorkspace, t.forwardPod} {
		if err := t.forwarded(ctx, forward, &r.pf[i]); err != nil {
			return nil, fmt.Errorf("%s: %w", []string{"client.PortForward", "kubectl port-forward"}[i], err)
		}
	}
	return &r, nil
}

// forwarded starts one forward and takes the port-forward figures
// through it.
func (t *targets) forwarded(ctx context.Context, forward func(context.Context) ([]uint16, <-chan error, error), f *pfFigures) error {
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	ports, done, err := forward(fctx)
	if err != nil {
		return err
	}
	if f.mibs, err = portforward.Throughput(ctx, ports[0], t.o.bytes); err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	if f.rps, err = portforward.RequestRate(ctx, ports[1], t.o.requests, t.o.concurrency, true); err != nil {
		return fmt.Errorf("requests: %w", err)
	}
	if f.cps, err = portforward.RequestRate(ctx, ports[1], t.o.requests/10, t.o.concurrency, false); err != nil {
		return fmt.Errorf("requests on new connections: %w", err)
	}
	stop()
	if err := <-done; err != nil {
		return fmt.Errorf("the forward ended: %w", err)
	}
	return nil
}
