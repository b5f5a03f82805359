// Package session is the session phase of hack/bench: the latency of one
// command of an agent platform's session, as a user and as a platform
// see it, on the shared local cluster of hack/bench
// (internal/rig/localcluster: etcd, kube-apiserver, the controller and
// the agents as processes, loopback only).
//
// It creates one BashWorkspace with the agents' defaults and waits until
// it is Ready, then runs, one at a time and alternating, -runs times each:
//
//   - the plugin: the built binary `kubectl-bashtask run -w W -- true`
//     (-bin-dir), exec'd with KUBECONFIG set to the cluster's kubeconfig,
//     as a user runs it; the figure is the whole process's wall time, from
//     the exec to its exit;
//   - the Go client: its Run of `true` in W with writers for both streams
//     (as a platform streams them), from the call to its return, on a
//     client made once (as a platform keeps one);
//
// after -warmup untimed runs of each. One watch of the phase's namespace,
// opened before the first run, sees each task appear and end: the tables
// split each figure at those moments. For the client's runs it also gives
// create→terminal on the client's clock: from the start of the create
// request (a wrapper of the client's transport notes it) to the watch
// event that shows the terminal reason (and from the create's return, as
// the system phase's e2e.latency counts); the plugin's runs have no such
// hook, so theirs start at the watch's first event of the task.
//
// Targets (docs/performance.md): the plugin's p50 <= 60 ms, the client's
// p50 <= 30 ms.
package session

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// Targets of the phase, in milliseconds (p50).
const (
	targetPluginMs = 60
	targetClientMs = 30
)

// Names of the phase's objects.
const (
	namespace = "bench-session"
	workspace = "session"
)

type options struct {
	runs, warmup int
	timeout      time.Duration
	// writers gives the client's Run writers for both streams.
	writers bool
}

// Phase is the session phase.
type Phase struct{ o options }

// Name is "session".
func (*Phase) Name() string { return "session" }

// Flags registers the phase's flags.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.o.runs, "runs", 50, "timed runs of the plugin and of the Go client each, alternating")
	fs.IntVar(&p.o.warmup, "warmup", 3, "untimed runs of each before the timed ones")
	fs.DurationVar(&p.o.timeout, "timeout", time.Minute, "limit of one run, and of the workspace's wait for Ready")
	fs.BoolVar(&p.o.writers, "client-writers", true, "give the Go client's Run writers for both streams, as a platform does (false: no writer, the output is not read)")
}

// Configure implements phase.ClusterUser: the phase runs on the shared
// cluster and needs nothing of its configuration.
func (*Phase) Configure(*phase.ClusterOptions) {}

// seen is when the phase's watch saw a task appear and end.
type seen struct {
	added, terminal time.Time
	reason          v1.Reason
}

// bench is one run of the phase.
type bench struct {
	o       options
	k8s     ctrlclient.WithWatch
	oc      *client.Client
	plugin  string
	kubecfg string
	mu      sync.Mutex
	tasks   map[string]*seen
	changed chan struct{}
	// creates are the start and return times of the Go client's creates
	// of the current run.
	creates []span
}

// span is one request's start and return.
type span struct{ start, end time.Time }

// samples are one kind of run's figures, in milliseconds.
type samples struct {
	wall, toSeen, seenToTerminal, terminalToEnd []float64
	// createToTerminal and createdToTerminal are the client's only, from
	// its create request's start and from its return.
	createToTerminal, createdToTerminal []float64
}

// Run measures the plugin's and the client's runs on the shared cluster.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	c, err := env.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	b := &bench{o: p.o, tasks: map[string]*seen{}, changed: make(chan struct{}, 1), kubecfg: c.Kubeconfig,
		plugin: filepath.Join(env.ClusterOptions.BinDir, "kubectl-bashtask")}
	if _, err := os.Stat(b.plugin); err != nil {
		return nil, fmt.Errorf("the plugin binary: %w (make build)", err)
	}
	if err := b.clients(); err != nil {
		return nil, err
	}
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	stop, err := b.watch(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	defer b.cleanup()
	var pl, cl samples
	for i := range p.o.warmup + p.o.runs {
		timed := i >= p.o.warmup
		if err := b.pluginRun(ctx, &pl, timed); err != nil {
			return nil, fmt.Errorf("plugin run %d: %w", i, err)
		}
		if err := b.clientRun(ctx, &cl, timed); err != nil {
			return nil, fmt.Errorf("client run %d: %w", i, err)
		}
	}
	return printTable(p.o, pl, cl), nil
}

// clients makes the bench's own client (the watch, the workspace) and the
// Go client under test, whose transport notes when each create of a
// BashTask starts.
func (b *bench) clients() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", b.kubecfg)
	if err != nil {
		return err
	}
	if b.k8s, err = phase.NewClient(cfg); err != nil {
		return err
	}
	tc := rest.CopyConfig(cfg)
	tc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/bashtasks") {
				return rt.RoundTrip(req)
			}
			start := time.Now()
			resp, err := rt.RoundTrip(req)
			b.mu.Lock()
			b.creates = append(b.creates, span{start, time.Now()})
			b.mu.Unlock()
			return resp, err
		})
	})
	b.oc, err = client.New(tc)
	return err
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// setup creates the namespace and the workspace and waits until it is
// Ready.
func (b *bench) setup(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := b.k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: workspace}}
	if err := b.k8s.Create(ctx, ws); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating workspace %s: %w", workspace, err)
	}
	deadline := time.Now().Add(b.o.timeout)
	for {
		var got v1.BashWorkspace
		if err := b.k8s.Get(ctx, ctrlclient.ObjectKeyFromObject(ws), &got); err != nil {
			return err
		}
		if ptr.Deref(got.Status.Phase, "") == v1.WorkspaceReady {
			fmt.Printf("workspace %s/%s is Ready on %s\n", namespace, workspace, ptr.Deref(got.Status.NodeName, "?"))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workspace %s not Ready after %s: phase %s: %s", workspace, b.o.timeout,
				ptr.Deref(got.Status.Phase, ""), ptr.Deref(got.Status.Message, ""))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cleanup deletes the workspace, so that the phases after this one find
// the agents as they were; the tasks go with their TTL.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), b.o.timeout)
	defer cancel()
	if err := b.oc.DeleteWorkspace(ctx, namespace, workspace); err != nil {
		fmt.Printf("deleting workspace %s: %v\n", workspace, err)
	}
}

// watch follows every task of the namespace, noting when each appeared
// and when its terminal reason was first seen.
func (b *bench) watch(ctx context.Context) (func(), error) {
	w, err := b.k8s.Watch(ctx, &v1.BashTaskList{}, ctrlclient.InNamespace(namespace))
	if err != nil {
		return nil, fmt.Errorf("watching tasks: %w", err)
	}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			bt, ok := ev.Object.(*v1.BashTask)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			b.mu.Lock()
			s := b.tasks[bt.Name]
			if s == nil {
				s = &seen{added: now}
				b.tasks[bt.Name] = s
			}
			if bt.Status.Reason != nil && s.terminal.IsZero() {
				s.terminal, s.reason = now, *bt.Status.Reason
			}
			b.mu.Unlock()
			select {
			case b.changed <- struct{}{}:
			default:
			}
		}
	}()
	return w.Stop, nil
}

// newTask waits until the watch has seen a task that is not in before
// end, and returns its name and times.
func (b *bench) newTask(ctx context.Context, before map[string]bool) (string, seen, error) {
	deadline := time.After(b.o.timeout)
	for {
		b.mu.Lock()
		for name, s := range b.tasks {
			if !before[name] && !s.terminal.IsZero() {
				got := *s
				b.mu.Unlock()
				return name, got, nil
			}
		}
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", seen{}, ctx.Err()
		case <-deadline:
			return "", seen{}, errors.New("the watch saw no new task end")
		case <-b.changed:
		}
	}
}

func (b *bench) known() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]bool, len(b.tasks))
	for name := range b.tasks {
		out[name] = true
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pluginRun execs `kubectl-bashtask run -w W -- true` once.
func (b *bench) pluginRun(ctx context.Context, s *samples, timed bool) error {
	before := b.known()
	rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	cmd := exec.CommandContext(rctx, b.plugin, "-n", namespace, "run", "-w", workspace, "--", "true")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+b.kubecfg)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	end := time.Now()
	if err != nil {
		return fmt.Errorf("%w: %s", err, out.String())
	}
	name, t, err := b.newTask(ctx, before)
	if err != nil {
		return err
	}
	if t.reason != v1.ReasonSucceeded {
		return fmt.Errorf("task %s ended %s", name, t.reason)
	}
	if timed {
		s.wall = append(s.wall, ms(end.Sub(start)))
		s.toSeen = append(s.toSeen, ms(t.added.Sub(start)))
		s.seenToTerminal = append(s.seenToTerminal, ms(t.terminal.Sub(t.added)))
		s.terminalToEnd = append(s.terminalToEnd, ms(end.Sub(t.terminal)))
	}
	return nil
}

// clientRun runs `true` in the workspace through the Go client once.
func (b *bench) clientRun(ctx context.Context, s *samples, timed bool) error {
	before := b.known()
	b.mu.Lock()
	b.creates = b.creates[:0]
	b.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	start := time.Now()
	code, err := runTrue(rctx, b.oc, b.o.writers)
	end := time.Now()
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("exit code %d", code)
	}
	name, t, err := b.newTask(ctx, before)
	if err != nil {
		return err
	}
	if t.reason != v1.ReasonSucceeded {
		return fmt.Errorf("task %s ended %s", name, t.reason)
	}
	b.mu.Lock()
	creates := slices.Clone(b.creates)
	b.mu.Unlock()
	if len(creates) != 1 {
		return fmt.Errorf("the client made %d creates, want 1", len(creates))
	}
	if timed {
		s.wall = append(s.wall, ms(end.Sub(start)))
		s.toSeen = append(s.toSeen, ms(creates[0].start.Sub(start)))
		s.createToTerminal = append(s.createToTerminal, ms(t.terminal.Sub(creates[0].start)))
		s.createdToTerminal = append(s.createdToTerminal, ms(t.terminal.Sub(creates[0].end)))
		s.terminalToEnd = append(s.terminalToEnd, ms(end.Sub(t.terminal)))
	}
	return nil
}

// runTrue is the Go client's run of `true` in the workspace, as a platform
// calls it, and its exit code.
func runTrue(ctx context.Context, oc *client.Client, writers bool) (int, error) {
	opts := client.RunOptions{Namespace: namespace, Workspace: workspace, Command: "true"}
	if writers {
		opts.Stdout, opts.Stderr = io.Discard, io.Discard
	}
	res, err := oc.Run(ctx, opts)
	if err != nil {
		return 0, err
	}
	return res.ExitCode, nil
}

// printTable prints the phase's table and returns its figures.
func printTable(o options, pl, cl samples) phase.Figures {
	fmt.Printf("\n== one command of a session: %d runs of each, one at a time, in workspace %s; load average %s\n", o.runs, workspace, phase.LoadAvg())
	tw := report.NewTable(os.Stdout, false)
	tw.Row("ms", "runs", "p50", "p90", "max", "target")
	row := func(what string, xs []float64, target float64) {
		if len(xs) == 0 {
			return
		}
		t := ""
		if target > 0 {
			t = fmt.Sprintf("p50 <= %.0f", target)
			if stats.Percentile(xs, 0.5) > target {
				t += " MISS"
			} else {
				t += " ok"
			}
		}
		tw.Rowf("%s\t%d\t%.1f\t%.1f\t%.1f\t%s", what, len(xs), stats.Percentile(xs, 0.5), stats.Percentile(xs, 0.9), slices.Max(xs), t)
	}
	row("kubectl-bashtask run -w W -- true, the process's wall time", pl.wall, targetPluginMs)
	row("  exec until the watch saw the task", pl.toSeen, 0)
	row("  the task seen until its terminal status seen", pl.seenToTerminal, 0)
	row("  terminal status seen until the process exited", pl.terminalToEnd, 0)
	row("Go client Run of true in W, call to return", cl.wall, targetClientMs)
	row("  the call until its create request started", cl.toSeen, 0)
	row("  create→terminal: the create request's start until the watch saw the terminal status", cl.createToTerminal, 0)
	row("    of it from the create's return (system's e2e.latency, there for plain tasks)", cl.createdToTerminal, 0)
	row("  terminal status seen until Run returned", cl.terminalToEnd, 0)
	_ = tw.Flush()
	f := phase.Figures{}
	put := func(key string, xs []float64) {
		if len(xs) == 0 {
			return
		}
		f[key+"_p50_ms"] = stats.Percentile(xs, 0.5)
		f[key+"_p90_ms"] = stats.Percentile(xs, 0.9)
		f[key+"_max_ms"] = slices.Max(xs)
	}
	put("session.plugin_run", pl.wall)
	put("session.client_run", cl.wall)
	put("session.create_terminal", cl.createToTerminal)
	put("session.created_terminal", cl.createdToTerminal)
	put("session.plugin_seen_terminal", pl.seenToTerminal)
	f["session.runs"] = float64(o.runs)
	return f
}
