// Package terminal is the terminal phase of hack/bench: keystroke echo
// through the API, on the shared local cluster of hack/bench
// (internal/rig/localcluster: etcd, kube-apiserver, the controller and
// the agents as processes, loopback only).
//
// It creates one task with spec.tty running `cat > /dev/null` and
// attaches to it with the Go client (bashtasks/attach through
// kube-apiserver and the output API, client-go's WebSocket executor).
// Then, -keys times after -warmup untimed keys, one at a time: it writes
// one byte to the attach's input and waits until the terminal's echo of
// it (the line discipline echoes a typed byte at once) comes back on the
// attach's output. The figure is the time from the write to the echo's
// arrival, on the client's clock: client → kube-apiserver → output API →
// the agent's Terminal service → the terminal's master, and the echo
// back through the executor's stdout stream, ReadOutput, the output API
// and kube-apiserver.
//
// Targets (docs/terminal.md, docs/performance.md): p50 <= 10 ms, p99 <=
// 50 ms.
package terminal

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// Targets of the phase, in milliseconds.
const (
	targetP50Ms = 10
	targetP99Ms = 50
)

// namespace is the phase's namespace.
const namespace = "bench-terminal"

type options struct {
	keys, warmup int
	timeout      time.Duration
}

// Phase is the terminal phase.
type Phase struct{ o options }

// Name is "terminal".
func (*Phase) Name() string { return "terminal" }

// Flags registers the phase's flags.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.o.keys, "keys", 500, "timed keystrokes, one at a time")
	fs.IntVar(&p.o.warmup, "warmup", 20, "untimed keystrokes before the timed ones")
	fs.DurationVar(&p.o.timeout, "timeout", time.Minute, "limit of the attach's start and of one echo")
}

// Configure implements phase.ClusterUser: the phase runs on the shared
// cluster and needs nothing of its configuration.
func (*Phase) Configure(*phase.ClusterOptions) {}

// echoes is the attach's output: a signal on every write.
type echoes struct {
	mu   sync.Mutex
	buf  []byte
	wake chan struct{}
}

func (e *echoes) Write(p []byte) (int, error) {
	e.mu.Lock()
	e.buf = append(e.buf, p...)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

// after returns whether b arrived at or after offset from.
func (e *echoes) after(from int, b byte) (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if i := slices.Index(e.buf[min(from, len(e.buf)):], b); i >= 0 {
		return from + i + 1, true
	}
	return from, false
}

// Run measures keystroke echo on the shared cluster.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	c, err := env.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	k8s, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	oc, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	task, err := oc.Start(ctx, client.RunOptions{Namespace: namespace, GenerateName: "echo-", Command: "cat > /dev/null", TTY: true, Timeout: 10 * time.Minute})
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = oc.Cancel(context.WithoutCancel(ctx), namespace, task.Name, task.UID)
		_ = k8s.Delete(context.WithoutCancel(ctx), task, ctrlclient.PropagationPolicy(metav1.DeletePropagationBackground))
	}()
	lat, err := p.measure(ctx, oc, task)
	if err != nil {
		return nil, err
	}
	return printTable(p.o, lat), nil
}

// measure attaches to task and times -warmup + -keys echoes.
func (p *Phase) measure(ctx context.Context, oc *client.Client, task *v1.BashTask) ([]float64, error) {
	return Echo(ctx, EchoOptions{Keys: p.o.keys, Warmup: p.o.warmup, Timeout: p.o.timeout},
		func(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
			return oc.Attach(ctx, namespace, task.Name, client.AttachOptions{Stdin: stdin, Stdout: stdout})
		})
}

// EchoOptions tune Echo.
type EchoOptions struct {
	// Keys is the number of timed keystrokes, Warmup the untimed ones
	// before them.
	Keys, Warmup int
	// Timeout bounds the wait for one echo.
	Timeout time.Duration
}

// Attacher connects stdin and stdout to a terminal until ctx ends (or the
// terminal's side ends, an error or nil).
type Attacher func(ctx context.Context, stdin io.Reader, stdout io.Writer) error

// Echo attaches with attach to a terminal whose program echoes nothing
// itself (`cat > /dev/null`: the line discipline echoes) and times
// o.Warmup + o.Keys keystrokes, one at a time, each from the write of its
// byte to the arrival of its echo, in milliseconds; the warm-up ones are
// left out.
func Echo(ctx context.Context, o EchoOptions, attach Attacher) ([]float64, error) {
	actx, detach := context.WithCancel(ctx)
	defer detach()
	pr, pw := io.Pipe()
	defer pw.Close()
	out := &echoes{wake: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- attach(actx, pr, out) }()
	var lat []float64
	seen := 0
	for i := range o.Warmup + o.Keys {
		key := byte('a' + i%26)
		start := time.Now()
		if _, err := pw.Write([]byte{key}); err != nil {
			return nil, fmt.Errorf("typing key %d: %w", i, err)
		}
		var err error
		if seen, err = out.wait(ctx, seen, key, o.Timeout, done); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		if i >= o.Warmup {
			lat = append(lat, float64(time.Since(start))/float64(time.Millisecond))
		}
	}
	return lat, nil
}

// wait waits until key arrives at or after offset from, returning the
// offset after it.
func (e *echoes) wait(ctx context.Context, from int, key byte, timeout time.Duration, done <-chan error) (int, error) {
	deadline := time.After(timeout)
	for {
		if next, ok := e.after(from, key); ok {
			return next, nil
		}
		select {
		case <-e.wake:
		case err := <-done:
			return from, fmt.Errorf("the attach ended: %w", cmpErr(err))
		case <-deadline:
			return from, fmt.Errorf("no echo within %s", timeout)
		case <-ctx.Done():
			return from, ctx.Err()
		}
	}
}

func cmpErr(err error) error {
	if err == nil {
		return errors.New("the task ended")
	}
	return err
}

func printTable(o options, lat []float64) phase.Figures {
	fmt.Printf("\n== keystroke echo through the API: %d keys, one at a time, on a task with spec.tty; load average %s\n", o.keys, phase.LoadAvg())
	tw := report.NewTable(os.Stdout, false)
	tw.Row("ms", "keys", "p50", "p90", "p99", "max", "target")
	p50, p99 := stats.Percentile(lat, 0.5), stats.Percentile(lat, 0.99)
	verdict := "ok"
	if p50 > targetP50Ms || p99 > targetP99Ms {
		verdict = "MISS"
	}
	tw.Rowf("%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%s", "write to echo, the Go client's Attach", len(lat), p50, stats.Percentile(lat, 0.9), p99, slices.Max(lat),
		fmt.Sprintf("p50 <= %d, p99 <= %d %s", targetP50Ms, targetP99Ms, verdict))
	_ = tw.Flush()
	return phase.Figures{
		"terminal.echo_p50_ms": p50,
		"terminal.echo_p90_ms": stats.Percentile(lat, 0.9),
		"terminal.echo_p99_ms": p99,
		"terminal.echo_max_ms": slices.Max(lat),
		"terminal.keys":        float64(o.keys),
	}
}
