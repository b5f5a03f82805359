// Package system is the system phase of hack/bench (formerly hack/bench
// itself). It measures the whole system the way users run it and prints
// one table, each figure next to its target:
//
//   - e2e latency: 500 `true` tasks created at 10 per second; per task, the
//     time from the return of the create call to the first watch event
//     whose status carries a terminal reason; p50 and p99;
//   - e2e throughput against the raw API figure, in alternating windows:
//     -pairs pairs (default 5) of a raw API window and a full-system
//     window, 2000 `true` tasks on each side in all. A full-system window
//     creates its tasks as fast as 16 client workers can; a raw API window
//     does, on a separate control plane started here beside the local
//     cluster with no controller and no agent (same binaries, CRD and
//     admission policies), per task only the create and the status writes
//     the controller did per task in the latency phase. Each window's
//     figure is its tasks divided by the time from the first create call
//     to the last terminal watch event; the ratio is the median of the
//     pairs' ratios, with half their range as its spread. The machine's
//     load, which moves over seconds, lands on both sides of a pair;
//   - kube-apiserver CPU per task on each side, from /proc/<pid>/stat;
//   - writes per task: the API server's own apiserver_request_total for
//     bashtasks (every subresource) and the write verbs, read from its
//     /metrics before and after the full-system windows, divided by the
//     number of tasks, with the breakdown per verb, subresource and code;
//   - controller RSS: VmRSS of the controller process once 10000 tasks in
//     total have finished.
//
// The table also takes in the figures of the phases that ran before it in
// the same run: the executor's (its headline figures), the output API's
// (latency and throughput of a follower, the controller's and the agent's
// RSS under 1000 followers) and the resume's (a Suspended workspace's
// resume until its first task starts); they are in the phase's JSON
// section too, under their own keys.
//
// The system runs on the shared local cluster of hack/bench
// (internal/rig/localcluster in this process: etcd, kube-apiserver, the
// controller and -agents agents as separate processes, a file:// bucket,
// loopback only), which the harness stops after the last phase that uses
// it, on error and on Ctrl-C.
package system

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

// namespace holds every task of a run.
const namespace = "bench"

type options struct {
	// binDir, assetsDir, crdDir, admissionDir and isolation come from the
	// shared cluster's options (the harness's flags).
	binDir, assetsDir       string
	crdDir, admissionDir    string
	isolation               string
	latencyTasks            int
	workspaces              int
	workspaceTasks          int
	latencyRate             float64
	throughputTasks         int
	pairs                   int
	settle                  time.Duration
	workers                 int
	rssTotal                int
	rssSettle               time.Duration
	phaseTimeout            time.Duration
	stall                   time.Duration
	qps                     float32
	burst                   int
	strict, skipRaw         bool
	rawStatusWritesOverride int
	profileDir              string
	profileFor              time.Duration
}

// Phase is the system phase.
type Phase struct{ o options }

// Name is "system".
func (*Phase) Name() string { return "system" }

// Flags registers the flags of the former hack/bench but those of its
// cluster (-bin-dir, -assets-dir, -crd-dir, -admission-dir, -agents,
// -controller-arg, -isolation, -keep: the harness's own now) and its
// -json and -*-json files (the harness writes one JSON file, and the
// other phases' figures come in process).
func (p *Phase) Flags(fs *flag.FlagSet) {
	o := &p.o
	fs.IntVar(&o.latencyTasks, "latency-tasks", 500, "tasks of the latency phase")
	fs.Float64Var(&o.latencyRate, "latency-rate", 10, "tasks created per second in the latency phase")
	fs.IntVar(&o.workspaces, "workspaces", 20, "workspaces of the workspace phase, created one at a time (0 skips the phase; it needs agents at the tenant level)")
	fs.IntVar(&o.workspaceTasks, "workspace-tasks", 50, "tasks run one at a time in a workspace, and as many plain ones alternating with them, in the workspace phase")
	fs.IntVar(&o.throughputTasks, "throughput-tasks", 2000, "tasks of the throughput phase, and of the raw API phase, each split evenly over the windows")
	fs.IntVar(&o.pairs, "pairs", 5, "pairs of windows (raw API, then full system) the throughput comparison alternates")
	fs.DurationVar(&o.settle, "window-settle", time.Second, "pause after each window, so that its trailing work does not land in the next")
	fs.IntVar(&o.workers, "workers", 16, "client workers of the throughput, raw API and fill phases")
	fs.IntVar(&o.rssTotal, "rss-tasks", 10000, "finished tasks in total before the controller's RSS is read (0 skips the phase)")
	fs.DurationVar(&o.rssSettle, "rss-settle", 5*time.Second, "wait between the last terminal task and the RSS reading")
	fs.DurationVar(&o.phaseTimeout, "phase-timeout", 10*time.Minute, "limit of each phase")
	fs.DurationVar(&o.stall, "stall-timeout", 2*time.Minute, "fail a phase when none of its missing tasks became terminal for this long")
	fs.Func("qps", "client QPS (default 1000)", func(s string) error {
		f, err := strconv.ParseFloat(s, 32)
		o.qps = float32(f)
		return err
	})
	fs.IntVar(&o.burst, "burst", 2000, "client burst")
	fs.BoolVar(&o.strict, "strict", false, "exit 1 when a figure misses its target")
	fs.BoolVar(&o.skipRaw, "skip-raw", false, "skip the raw API phase (and the ratio)")
	fs.IntVar(&o.rawStatusWritesOverride, "raw-status-writes", -1, "status writes per task in the raw API phase (default: as measured in the latency phase)")
	fs.StringVar(&o.profileDir, "profile-dir", "", "take CPU profiles of kube-apiserver, the controller and the agents during the throughput phase into this directory (empty: none)")
	fs.DurationVar(&o.profileFor, "profile-duration", 10*time.Second, "length of the CPU profiles of -profile-dir; they start 2 s into the throughput phase (and the raw API phase, whose kube-apiserver profile goes to <dir>/raw)")
}

// Configure takes the shared cluster as the harness's flags make it: the
// phase runs on it, and needs nothing else of it.
func (p *Phase) Configure(*phase.ClusterOptions) {}

// Run measures the whole system on the shared cluster and prints the
// table, which takes in the figures of the phases that ran before.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	o := p.o
	if o.qps == 0 {
		o.qps = 1000
	}
	if o.pairs < 1 || o.throughputTasks < o.pairs {
		return nil, fmt.Errorf("-pairs must be at least 1 and at most -throughput-tasks (%d), got %d", o.throughputTasks, o.pairs)
	}
	co := env.ClusterOptions
	o.binDir, o.assetsDir, o.crdDir, o.admissionDir = co.BinDir, co.AssetsDir, co.CRDDir, co.AdmissionDir
	return run(ctx, o, env)
}

var errMiss = errors.New("a figure missed its target")

// minRatioToRaw is the target of e2e.ratio_to_raw: the full system's
// throughput against the raw API figure measured in the same run.
const minRatioToRaw = 0.80

// figures are the results of one run; a NaN is a figure not measured.
type figures struct {
	latP50, latP99 float64
	// throughput and raw are the medians of the full-system and raw API
	// windows, in tasks/s; ratios are full/raw of each pair of windows.
	throughput, raw float64
	ratios          []float64
	// apiCPU and rawAPICPU are kube-apiserver's CPU per task, in ms, over
	// the full-system and the raw API windows.
	apiCPU, rawAPICPU float64
	writesPerTask     float64
	rssMB             float64
	// wsCreateP50/P99 are a workspace's create-to-Ready times; wsTaskP50
	// and wsPlainP50 the latencies of tasks run one at a time in a
	// workspace and without one, in ms.
	wsCreateP50, wsCreateP99 float64
	wsTaskP50, wsPlainP50    float64
	// wsCopyMBps is the median rate of a workspace's 50 MiB file copied
	// out by the client's CopyFrom, in MB/s.
	wsCopyMBps float64
	executor   map[string]float64
	// output holds the output phase's figures, by their keys.
	output map[string]float64
	// resume holds the resume phase's figures, by their keys.
	resume           map[string]float64
	loadStart, loadE string
}

// ratio is the median of the pairs' ratios, NaN without pairs.
func (f figures) ratio() float64 { return stats.Median(f.ratios) }

// ratioSpread is half the range of the pairs' ratios: the ratio is
// ratio() ± ratioSpread().
func (f figures) ratioSpread() float64 { return stats.Spread(f.ratios) }

func run(ctx context.Context, o options, env *phase.Env) (phase.Figures, error) {
	f := figures{latP50: math.NaN(), latP99: math.NaN(), throughput: math.NaN(), raw: math.NaN(),
		wsCreateP50: math.NaN(), wsCreateP99: math.NaN(), wsTaskP50: math.NaN(), wsPlainP50: math.NaN(), wsCopyMBps: math.NaN(),
		apiCPU: math.NaN(), rawAPICPU: math.NaN(), writesPerTask: math.NaN(), rssMB: math.NaN()}
	f.loadStart = phase.LoadAvg()
	f.executor, f.output, f.resume = env.Results["executor"], env.Results["output"], env.Results["resume"]
	fmt.Printf("machine: %d CPUs, load average %s\n", runtime.NumCPU(), f.loadStart)

	// A failed phase ends the run, but the table still shows what was
	// measured before it.
	phaseErr := runCluster(ctx, o, env, &f)
	f.loadE = phase.LoadAvg()
	miss := printTable(o, f)
	if phaseErr != nil {
		return figuresOf(f), phaseErr
	}
	if miss && o.strict {
		return figuresOf(f), errMiss
	}
	return figuresOf(f), nil
}

// runCluster takes the shared cluster (starting it if no phase did) and,
// unless -skip-raw, starts the raw API control plane beside it; runs the
// latency phase, the alternating throughput windows and the RSS phase;
// and stops the raw control plane, whatever happens (the harness stops
// the shared cluster).
func runCluster(ctx context.Context, o options, env *phase.Env, f *figures) error {
	lc, err := env.Cluster(ctx)
	if err != nil {
		return err
	}
	dir := lc.Dir
	o.isolation = lc.Isolation
	defer reportLogErrors(dir)

	cfg, err := clientcmd.BuildConfigFromFlags("", lc.Kubeconfig)
	if err != nil {
		return err
	}
	b, err := newBench(ctx, cfg, o)
	if err != nil {
		return err
	}
	defer b.close()
	ctrlMetrics := controllerMetricsURL(dir)

	// Latency. Its tasks also give the statuses and the number of status
	// writes the raw API windows repeat.
	latBefore, err := b.apiRequests(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("\n== latency: %d tasks at %.0f per second\n", o.latencyTasks, o.latencyRate)
	lat, err := b.latencyPhase(ctx, o)
	if err != nil {
		return fmt.Errorf("latency phase: %w", err)
	}
	f.latP50, f.latP99 = stats.Percentile(lat, 0.50), stats.Percentile(lat, 0.99)
	fmt.Printf("latency: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n", f.latP50, stats.Percentile(lat, 0.90), f.latP99, stats.Percentile(lat, 1))
	b.printReasons("lat-")
	time.Sleep(2 * time.Second) // trailing writes of the latency phase
	latAfter, err := b.apiRequests(ctx)
	if err != nil {
		return err
	}
	latCounts := latAfter.minus(latBefore)
	latCounts.setN(o.latencyTasks)

	if err := b.workspaceFigures(ctx, o, f); err != nil {
		return err
	}

	// The raw API control plane runs beside the local cluster, idle but
	// for its own housekeeping while the full system's windows run, and
	// the other way round.
	var rb *bench
	var templates []v1.BashTaskStatus
	if !o.skipRaw {
		statusWrites := o.rawStatusWritesOverride
		if statusWrites < 0 {
			statusWrites = int(math.Round(latCounts.perTask(isStatusWrite)))
		}
		templates = statusTemplates(b.sampleStatuses(), statusWrites)
		fmt.Printf("\n== starting the raw API control plane (create + %d status writes per task, no controller or agent)\n", statusWrites)
		cp, err := localcluster.StartControlPlane(ctx, o.assetsDir, o.crdDir, o.admissionDir)
		if err != nil {
			return fmt.Errorf("raw API control plane: %w", err)
		}
		defer func() {
			if err := cp.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "bench: stopping the raw control plane:", err)
			}
		}()
		if rb, err = newBench(ctx, cp.Config, o); err != nil {
			return fmt.Errorf("raw API control plane: %w", err)
		}
		defer rb.close()
	}

	// Throughput: alternating windows, raw API then full system, so that
	// the machine's load lands on both sides of each pair.
	time.Sleep(o.settle)
	before, err := b.apiRequests(ctx)
	if err != nil {
		return err
	}
	ctrlBefore := scrapeController(ctx, ctrlMetrics)
	procs, rawProcs := components(dir, lc.ControlPlanePIDs), rawComponents(lc.ControlPlanePIDs)
	var fullCPU, rawCPU, fullIdle, rawIdle cpuTotal
	perWindow := o.throughputTasks / o.pairs
	profileAt := min(1, o.pairs-1) // a warm window
	var full, raw []float64
	if rb != nil {
		fmt.Printf("\n== throughput: %d pairs of windows (raw API, full system) of %d tasks each, %d workers\n", o.pairs, perWindow, o.workers)
	} else {
		fmt.Printf("\n== throughput: %d full-system windows of %d tasks each, %d workers\n", o.pairs, perWindow, o.workers)
	}
	for i := range o.pairs {
		if rb != nil {
			var prof func()
			if o.profileDir != "" && i == profileAt {
				prof = rb.startProfiles(ctx, nil, filepath.Join(o.profileDir, "raw"), o.profileFor)
			}
			c0, i0 := snapshotCPU(rawProcs), snapshotCPU(procs)
			tps, err := rb.rawWindow(ctx, o, fmt.Sprintf("raw-%d-", i), perWindow, templates)
			if err != nil {
				return fmt.Errorf("raw API window %d: %w", i+1, err)
			}
			time.Sleep(o.settle) // trailing work counts with its window
			c1, i1 := snapshotCPU(rawProcs), snapshotCPU(procs)
			if prof != nil {
				prof()
			}
			rawCPU.add(c0, c1)
			fullIdle.add(i0, i1)
			raw = append(raw, tps)
		}
		var prof func()
		if o.profileDir != "" && i == profileAt {
			prof = b.startProfiles(ctx, procs, o.profileDir, o.profileFor)
		}
		c0, i0 := snapshotCPU(procs), snapshotCPU(rawProcs)
		tps, err := b.throughputPhase(ctx, o, fmt.Sprintf("tp-%d-", i), perWindow, "throughput")
		if err != nil {
			return fmt.Errorf("throughput window %d: %w", i+1, err)
		}
		time.Sleep(o.settle)
		c1, i1 := snapshotCPU(procs), snapshotCPU(rawProcs)
		if prof != nil {
			prof()
		}
		fullCPU.add(c0, c1)
		if rb != nil {
			rawIdle.add(i0, i1)
		}
		full = append(full, tps)
		line := fmt.Sprintf("pair %d: full system %.1f tasks/s", i+1, tps)
		if rb != nil {
			f.ratios = append(f.ratios, tps/raw[i])
			line = fmt.Sprintf("pair %d: raw API %.1f tasks/s, full system %.1f tasks/s, ratio %.2f", i+1, raw[i], tps, tps/raw[i])
		}
		fmt.Println(line)
	}
	n := perWindow * o.pairs
	f.throughput = stats.Median(full)
	f.apiCPU = fullCPU.msPerTask("kube-apiserver", n)
	fmt.Printf("throughput: median %.1f tasks/s (windows: %s)\n", f.throughput, joinFloats(full, "%.1f"))
	b.printReasons("tp-")
	if rb != nil {
		f.raw = stats.Median(raw)
		f.rawAPICPU = rawCPU.msPerTask("kube-apiserver", n)
		fmt.Printf("raw API: median %.1f tasks/s (windows: %s)\n", f.raw, joinFloats(raw, "%.1f"))
		fmt.Printf("ratio to raw: median of the pairs %.2f ± %.2f (pairs: %s)\n", f.ratio(), f.ratioSpread(), joinFloats(f.ratios, "%.2f"))
	}
	time.Sleep(3 * time.Second) // writes after the terminal one (uploads, if any)
	after, err := b.apiRequests(ctx)
	if err != nil {
		return err
	}
	breakdown := after.minus(before)
	breakdown.setN(n)
	f.writesPerTask = breakdown.perTask(isTaskWrite)
	breakdown.print()
	fullCPU.print("full-system windows", n)
	if rb != nil {
		rawCPU.print("raw API windows", n)
		fmt.Printf("idle side: the local cluster used %.2f cores during the raw windows, the raw control plane %.2f cores during the full-system windows\n",
			idleCores(fullIdle, "bench (client)"), idleCores(rawIdle, "bench (client)"))
	}
	printController(ctrlBefore, scrapeController(ctx, ctrlMetrics), n)

	// Controller memory with many finished tasks.
	if o.rssTotal > 0 {
		done := b.terminalCount()
		fill := o.rssTotal - done
		fmt.Printf("\n== controller RSS: %d more tasks, to %d finished\n", max(fill, 0), o.rssTotal)
		if fill > 0 {
			if _, err := b.throughputPhase(ctx, o, "fill-", fill, "fill"); err != nil {
				return fmt.Errorf("RSS phase: %w", err)
			}
			b.printReasons("fill-")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.rssSettle):
		}
		rss, hwm, pid, err := controllerRSS(dir)
		if err != nil {
			return fmt.Errorf("RSS phase: %w", err)
		}
		f.rssMB = rss
		fmt.Printf("controller (pid %d): VmRSS %.1f MiB, VmHWM %.1f MiB, with %d finished tasks\n", pid, rss, hwm, b.terminalCount())
	}
	return nil
}

// bench is a client of one control plane with a watch on the namespace.
type bench struct {
	c       client.WithWatch
	bc      *btclient.Client
	cs      *kubernetes.Clientset
	cancel  context.CancelFunc
	watchWG sync.WaitGroup

	mu       sync.Mutex
	created  map[string]time.Time // when the create call returned
	terminal map[string]time.Time // when the first terminal event arrived
	reasons  map[string]v1.Reason
	samples  map[string][]v1.BashTaskStatus // status sequences of a few throughput tasks
	last     map[string]string              // the last status seen, in short
	stall    time.Duration
	watchErr error
}

func newBench(ctx context.Context, cfg *rest.Config, o options) (*bench, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.qps, o.burst
	c, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// A client's REST mapper may read an older discovery document on a
	// loaded machine; start once it resolves the kind.
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.List(ctx, &v1.BashTaskList{}, client.Limit(1))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("BashTasks not served: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	if err := localcluster.WaitAdmission(ctx, c, namespace); err != nil {
		return nil, err
	}
	bc, err := btclient.New(cfg)
	if err != nil {
		return nil, err
	}
	b := &bench{c: c, cs: cs, bc: bc,
		created: map[string]time.Time{}, terminal: map[string]time.Time{},
		reasons: map[string]v1.Reason{}, samples: map[string][]v1.BashTaskStatus{},
		last: map[string]string{}, stall: o.stall}
	wctx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	ready := make(chan struct{})
	b.watchWG.Add(1)
	go b.watch(wctx, ready)
	select {
	case <-ready:
	case <-time.After(time.Minute):
		b.close()
		return nil, errors.New("the watch on BashTasks did not start in a minute")
	}
	return b, nil
}

func (b *bench) close() {
	b.cancel()
	b.watchWG.Wait()
}

// watch follows every BashTask of the namespace until ctx ends, resuming
// from the last resourceVersion seen when the server closes the watch and
// listing again when that version is gone.
func (b *bench) watch(ctx context.Context, ready chan struct{}) {
	defer b.watchWG.Done()
	rv := ""
	first := true
	for ctx.Err() == nil {
		if rv == "" {
			var list v1.BashTaskList
			if err := b.c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
				b.setWatchErr(err)
				time.Sleep(time.Second)
				continue
			}
			now := time.Now()
			for i := range list.Items {
				b.observe(&list.Items[i], now)
			}
			rv = list.ResourceVersion
		}
		w, err := b.c.Watch(ctx, &v1.BashTaskList{}, client.InNamespace(namespace),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			b.setWatchErr(err)
			time.Sleep(time.Second)
			continue
		}
		if first {
			close(ready)
			first = false
		}
		for ev := range w.ResultChan() {
			now := time.Now()
			if ev.Type == watch.Error {
				if st, ok := ev.Object.(*metav1.Status); ok && (st.Code == 410) {
					rv = ""
				}
				b.setWatchErr(fmt.Errorf("watch error: %v", ev.Object))
				break
			}
			bt, ok := ev.Object.(*v1.BashTask)
			if !ok {
				continue
			}
			rv = bt.ResourceVersion
			if ev.Type != watch.Bookmark && ev.Type != watch.Deleted {
				b.observe(bt, now)
			}
		}
		w.Stop()
	}
}

func (b *bench) setWatchErr(err error) {
	b.mu.Lock()
	b.watchErr = err
	b.mu.Unlock()
}

// observe records the first terminal status of a task, and the sequence
// of statuses of the first few latency tasks.
func (b *bench) observe(bt *v1.BashTask, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if strings.HasPrefix(bt.Name, "lat-0000") {
		if bt.Status.NodeName != nil || bt.Status.Reason != nil {
			seq := b.samples[bt.Name]
			if len(seq) < 8 && (len(seq) == 0 || !statusEqual(seq[len(seq)-1], bt.Status)) && b.terminal[bt.Name].IsZero() {
				b.samples[bt.Name] = append(seq, *bt.Status.DeepCopy())
			}
		}
	}
	b.last[bt.Name] = fmt.Sprintf("phase %q, node %q, reason %q, resourceVersion %s",
		ptr.Deref(bt.Status.Phase, ""), ptr.Deref(bt.Status.NodeName, ""), ptr.Deref(bt.Status.Reason, ""), bt.ResourceVersion)
	if bt.Status.Reason == nil {
		return
	}
	if _, ok := b.terminal[bt.Name]; !ok {
		b.terminal[bt.Name] = now
		b.reasons[bt.Name] = *bt.Status.Reason
	}
}

func statusEqual(a, b v1.BashTaskStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

func (b *bench) terminalCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.terminal)
}

// sampleStatuses returns the status sequence the watch saw for one
// latency task, the one with the most statuses among the sampled.
func (b *bench) sampleStatuses() []v1.BashTaskStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	var best []v1.BashTaskStatus
	for _, name := range sortedKeys(b.samples) {
		seq := b.samples[name]
		if len(seq) > 0 && seq[len(seq)-1].Reason != nil && len(seq) > len(best) {
			best = seq
		}
	}
	return best
}

func (b *bench) create(ctx context.Context, name string) error {
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
	if err := b.c.Create(ctx, bt); err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	now := time.Now()
	b.mu.Lock()
	b.created[name] = now
	b.mu.Unlock()
	return nil
}

// waitTerminal waits until every named task has had a terminal event. It
// fails at the deadline, or earlier when no task of the phase became
// terminal for the stall limit, naming some of the missing tasks and the
// last status the watch saw for each.
func (b *bench) waitTerminal(ctx context.Context, names []string, deadline time.Time, phase string) error {
	lastDone, lastProgress := -1, time.Now()
	for {
		b.mu.Lock()
		var missing []string
		for _, n := range names {
			if _, ok := b.terminal[n]; !ok {
				missing = append(missing, n)
			}
		}
		werr := b.watchErr
		var detail []string
		now := time.Now()
		stalled := now.Sub(lastProgress) > b.stall
		if len(missing) > 0 && (now.After(deadline) || stalled) {
			for _, n := range missing[:min(len(missing), 10)] {
				detail = append(detail, fmt.Sprintf("%s (%s)", n, cmp.Or(b.last[n], "never seen by the watch")))
			}
		}
		b.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if done := len(names) - len(missing); done != lastDone {
			lastDone, lastProgress = done, now
		}
		if detail != nil {
			why := "within the phase limit"
			if stalled {
				why = fmt.Sprintf("and none became terminal for %s", b.stall)
			}
			msg := fmt.Sprintf("%d of %d tasks of the %s phase not terminal %s; among them: %s",
				len(missing), len(names), phase, why, strings.Join(detail, ", "))
			if werr != nil {
				msg += fmt.Sprintf(" (last watch error: %v)", werr)
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// latencyPhase creates tasks on a ticker, each create in its own goroutine
// so a slow call does not delay the next, and returns the latencies in ms.
func (b *bench) latencyPhase(ctx context.Context, o options) ([]float64, error) {
	deadline := time.Now().Add(o.phaseTimeout)
	names := make([]string, o.latencyTasks)
	for i := range names {
		names[i] = fmt.Sprintf("lat-%05d", i)
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.latencyRate))
	defer tick.Stop()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for i, name := range names {
		if i > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return nil, ctx.Err()
			case <-tick.C:
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.create(ctx, name); err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return nil, err
	}
	if err := b.waitTerminal(ctx, names, deadline, "latency"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	lat := make([]float64, 0, len(names))
	for _, n := range names {
		d := b.terminal[n].Sub(b.created[n])
		lat = append(lat, max(float64(d)/float64(time.Millisecond), 0))
	}
	return lat, nil
}

// throughputPhase creates n tasks with the workers as fast as they go and
// returns n divided by the time from the first create call to the last
// terminal event.
func (b *bench) throughputPhase(ctx context.Context, o options, prefix string, n int, phase string) (float64, error) {
	deadline := time.Now().Add(o.phaseTimeout)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	start := time.Now()
	if err := runWorkers(ctx, o.workers, names, func(ctx context.Context, name string) error { return b.create(ctx, name) }); err != nil {
		return 0, err
	}
	created := time.Since(start)
	if err := b.waitTerminal(ctx, names, deadline, phase); err != nil {
		return 0, err
	}
	end := b.lastTerminal(names)
	fmt.Printf("%s: %d creates in %s, last terminal %s after the first create\n", phase, n, created.Round(time.Millisecond), end.Sub(start).Round(time.Millisecond))
	return float64(n) / end.Sub(start).Seconds(), nil
}

func (b *bench) lastTerminal(names []string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var end time.Time
	for _, n := range names {
		if t := b.terminal[n]; t.After(end) {
			end = t
		}
	}
	return end
}

// printReasons prints the terminal reasons of a phase's tasks when any is
// not Succeeded: a figure of failed tasks measures something else.
func (b *bench) printReasons(prefix string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	counts := map[string]int{}
	for n, r := range b.reasons {
		if strings.HasPrefix(n, prefix) {
			counts[string(r)]++
		}
	}
	if len(counts) == 1 && counts[string(v1.ReasonSucceeded)] > 0 {
		return
	}
	fmt.Printf("WARNING: terminal reasons of %s tasks: %v\n", strings.TrimSuffix(prefix, "-"), counts)
}

// runWorkers calls fn for every name from n goroutines and returns the
// first error; after an error the remaining names are skipped.
func runWorkers(ctx context.Context, n int, names []string, fn func(context.Context, string) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				if err := fn(ctx, names[i]); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// requestKey is one series of apiserver_request_total.
type requestKey struct{ resource, verb, subresource, code string }

// requestCounts are request counts per series, over n tasks.
type requestCounts map[requestKey]float64

// writeVerbs are the verb label values of write requests. The API server
// labels a request with its HTTP method (POST, PUT, PATCH, DELETE), and
// server-side apply as APPLY; the admission-style names are accepted too.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true,
	"APPLY": true, "CREATE": true, "UPDATE": true}

func isWrite(k requestKey) bool       { return writeVerbs[k.verb] }
func isTaskWrite(k requestKey) bool   { return isWrite(k) && k.resource == "bashtasks" }
func isStatusWrite(k requestKey) bool { return isTaskWrite(k) && k.subresource == "status" }

// apiRequests reads the API server's requests: writes on bashtasks, and for
// the breakdown the writes on every other resource (events, leases) and the
// reads (GET, LIST; a WATCH counts once, when it opens).
func (b *bench) apiRequests(ctx context.Context) (requestCounts, error) {
	raw, err := b.cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	wc := requestCounts{}
	seen := false
	for _, s := range parseMetric(raw, "apiserver_request_total") {
		resource := s.labels["resource"]
		if resource == "bashtasks" {
			if s.labels["group"] != v1.GroupVersion.Group {
				continue
			}
			seen = true
		}
		wc[requestKey{resource, s.labels["verb"], s.labels["subresource"], s.labels["code"]}] += s.value
	}
	if !seen {
		return nil, errors.New("the API server's /metrics has no apiserver_request_total series for bashtasks")
	}
	return wc, nil
}

func (w requestCounts) minus(before requestCounts) requestCounts {
	d := requestCounts{}
	for k, v := range w {
		if v-before[k] > 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

// perTask sums the matching series and divides by the number of tasks
// (setN).
func (w requestCounts) perTask(match func(requestKey) bool) float64 {
	n := w[requestKey{verb: "#tasks"}]
	var sum float64
	for k, v := range w {
		if k.verb != "#tasks" && match(k) {
			sum += v
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / n
}

// setN records the number of tasks under a key no series has.
func (w requestCounts) setN(n int) { w[requestKey{verb: "#tasks"}] = float64(n) }

func (w requestCounts) print() {
	n := w[requestKey{verb: "#tasks"}]
	fmt.Printf("API requests in the full-system windows (apiserver_request_total), %0.f tasks; writes_per_task counts writes on bashtasks only:\n", n)
	keys := make([]requestKey, 0, len(w))
	for k := range w {
		if k.verb != "#tasks" {
			keys = append(keys, k)
		}
	}
	others := func(k requestKey) int { // bashtask writes, other writes, then reads
		switch {
		case isTaskWrite(k):
			return 0
		case isWrite(k):
			return 1
		}
		return 2
	}
	slices.SortFunc(keys, func(a, b requestKey) int {
		return cmp.Or(cmp.Compare(others(a), others(b)), cmp.Compare(a.resource, b.resource), cmp.Compare(a.verb, b.verb), cmp.Compare(a.subresource, b.subresource), cmp.Compare(a.code, b.code))
	})
	tw := report.NewTable(os.Stdout, false)
	fmt.Fprintf(tw, "  resource\tverb\tsubresource\tcode\trequests\tper task\n")
	for _, k := range keys {
		sub := k.subresource
		if sub == "" {
			sub = "(object)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%.0f\t%.3f\n", k.resource, k.verb, sub, k.code, w[k], w[k]/n)
	}
	fmt.Fprintf(tw, "  writes on bashtasks, all\t\t\t\t\t%.3f\n", w.perTask(isTaskWrite))
	fmt.Fprintf(tw, "  writes on other resources, all\t\t\t\t\t%.3f\n", w.perTask(func(k requestKey) bool { return isWrite(k) && !isTaskWrite(k) }))
	fmt.Fprintf(tw, "  reads, all\t\t\t\t\t%.3f\n", w.perTask(func(k requestKey) bool { return !isWrite(k) }))
	_ = tw.Flush()
}

type sample struct {
	labels map[string]string
	value  float64
}

// parseMetric reads the samples of one metric from Prometheus text.
func parseMetric(raw []byte, name string) []sample {
	var out []sample
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		s := sample{labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			var ok bool
			rest, ok = parseLabels(rest[1:], s.labels)
			if !ok {
				continue
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// parseLabels reads `a="x",b="y"}` into m and returns what follows.
func parseLabels(s string, m map[string]string) (string, bool) {
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return s[1:], true
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", false
		}
		key := s[:eq]
		s = s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", false
		}
		m[key] = val.String()
		s = s[i+1:]
	}
}

// controllerMetricsURL finds the controller's metrics address in its
// command line; empty when it cannot.
func controllerMetricsURL(dir string) string {
	pid := readPID(filepath.Join(dir, "pids", "controller"))
	if pid == 0 {
		return ""
	}
	addr := flagValue(pid, "--metrics-bind-address")
	if addr == "" || addr == "0" {
		return ""
	}
	return "http://" + addr + "/metrics"
}

// scrapeController returns the controller's counters the benchmark reports,
// keyed by series: bashtask_status_writes_total per kind, and the
// reconciles, workqueue adds, and the sums and counts of the workqueue's
// queue and work durations of the bashtask controller. Nil when the
// controller's metrics cannot be read.
func scrapeController(ctx context.Context, url string) map[string]float64 {
	if url == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := httpGet(ctx, url)
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, s := range parseMetric(raw, "bashtask_status_writes_total") {
		out["status writes, "+s.labels["kind"]] += s.value
	}
	for _, s := range parseMetric(raw, "controller_runtime_reconcile_total") {
		if s.labels["controller"] == "bashtask" {
			out["reconciles, "+s.labels["result"]] += s.value
		}
	}
	for _, name := range []string{"workqueue_adds_total", "workqueue_retries_total",
		"workqueue_queue_duration_seconds_sum", "workqueue_queue_duration_seconds_count",
		"workqueue_work_duration_seconds_sum", "workqueue_work_duration_seconds_count"} {
		for _, s := range parseMetric(raw, name) {
			if s.labels["name"] == "bashtask" {
				out[name] += s.value
			}
		}
	}
	return out
}

// printController prints what the controller did in a phase of n tasks.
func printController(before, after map[string]float64, n int) {
	if before == nil || after == nil {
		return
	}
	d := func(k string) float64 { return after[k] - before[k] }
	fmt.Println("controller in the full-system windows (its /metrics), per task:")
	for _, k := range sortedKeys(after) {
		if strings.HasPrefix(k, "status writes, ") || strings.HasPrefix(k, "reconciles, ") {
			if v := d(k); v > 0 {
				fmt.Printf("  %-22s %6.0f  %.3f\n", k, v, v/float64(n))
			}
		}
	}
	if v := d("workqueue_adds_total"); v > 0 {
		fmt.Printf("  %-22s %6.0f  %.3f\n", "workqueue adds", v, v/float64(n))
	}
	if c := d("workqueue_queue_duration_seconds_count"); c > 0 {
		fmt.Printf("  mean wait in the workqueue %.1f ms, mean reconcile %.1f ms\n",
			1000*d("workqueue_queue_duration_seconds_sum")/c,
			1000*d("workqueue_work_duration_seconds_sum")/max(d("workqueue_work_duration_seconds_count"), 1))
	}
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// controllerRSS reads VmRSS and VmHWM of the controller in MiB.
func controllerRSS(dir string) (rss, hwm float64, pid int, err error) {
	raw, err := os.ReadFile(filepath.Join(dir, "pids", "controller"))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reading the controller's pid: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reading the controller's pid: %w", err)
	}
	m, err := procfs.ReadMemory(pid)
	if err != nil {
		return 0, 0, pid, fmt.Errorf("reading the controller's memory: %w", err)
	}
	return float64(m.RSS) / (1 << 20), float64(m.HWM) / (1 << 20), pid, nil
}

// rawWindow runs n tasks named prefix00000, ... on the raw API control
// plane: per task the create and then each status of templates written
// through the status subresource, each conditional on the version the
// previous write returned and, like the controller's, without
// managedFields, from o.workers workers. It returns n divided by
// the time from the first create call to the last terminal watch event (to
// the last write when the templates end in no terminal status).
func (b *bench) rawWindow(ctx context.Context, o options, prefix string, n int, templates []v1.BashTaskStatus) (float64, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	deadline := time.Now().Add(o.phaseTimeout)
	start := time.Now()
	err := runWorkers(ctx, o.workers, names, func(ctx context.Context, name string) error {
		bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
		if err := b.c.Create(ctx, bt); err != nil {
			return fmt.Errorf("creating %s: %w", name, err)
		}
		for _, t := range templates {
			// The controller caches tasks without managedFields and so
			// never sends them back; neither does this client.
			bt.ManagedFields = nil
			bt.Status = stamp(t, bt.Generation)
			if err := b.c.Status().Update(ctx, bt); err != nil {
				return fmt.Errorf("writing the status of %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(templates) == 0 || templates[len(templates)-1].Reason == nil {
		// Nothing terminal to watch for: the window ends with the last write.
		return float64(n) / time.Since(start).Seconds(), nil
	}
	if err := b.waitTerminal(ctx, names, deadline, "raw API"); err != nil {
		return 0, err
	}
	return float64(n) / b.lastTerminal(names).Sub(start).Seconds(), nil
}

// statusTemplates returns n statuses to write in order: the write-ahead
// first and the terminal status last, as the controller wrote them for a
// sampled task, or made up alike when no sample was seen.
func statusTemplates(sample []v1.BashTaskStatus, n int) []v1.BashTaskStatus {
	if n <= 0 {
		return nil
	}
	if len(sample) == 0 || sample[len(sample)-1].Reason == nil {
		sample = madeUpStatuses()
	}
	out := make([]v1.BashTaskStatus, n)
	for i := range out {
		switch {
		case i == n-1:
			out[i] = sample[len(sample)-1]
		case len(sample) >= 2:
			out[i] = sample[min(i, len(sample)-2)]
		default:
			out[i] = madeUpStatuses()[0]
		}
	}
	return out
}

// stamp copies a template status with its times set to now.
func stamp(t v1.BashTaskStatus, generation int64) v1.BashTaskStatus {
	s := *t.DeepCopy()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	s.ObservedGeneration = &generation
	if s.StartTime != nil {
		s.StartTime = &now
	}
	if s.CompletionTime != nil {
		s.CompletionTime = &now
	}
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = now
		s.Conditions[i].ObservedGeneration = generation
	}
	return s
}

// madeUpStatuses are a write-ahead and a terminal status of a `true` task
// shaped like the controller's.
func madeUpStatuses() []v1.BashTaskStatus {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	zero := int32(0)
	enforced := true
	agent := &v1.AgentRef{Pod: ptr.To("bashtask-agent-node-1"), Incarnation: ptr.To("0f6c2b8e-3a51-4d7e-9a0c-5b1e2d3f4a5b")}
	scheduled := metav1.Condition{Type: v1.ConditionScheduled, Status: metav1.ConditionTrue, Reason: "Dispatched",
		Message: "dispatched to the agent on node node-1", LastTransitionTime: now}
	ahead := v1.BashTaskStatus{Phase: ptr.To(v1.PhasePending), NodeName: ptr.To("node-1"), Agent: agent, Conditions: []metav1.Condition{scheduled}}
	empty := func() *v1.StreamStatus {
		return &v1.StreamStatus{TotalBytes: ptr.To[int64](0), SHA256: ptr.To("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")}
	}
	done := v1.BashTaskStatus{
		Phase: ptr.To(v1.PhaseSucceeded), Reason: ptr.To(v1.ReasonSucceeded), Message: ptr.To("the command exited with status 0"),
		ExitCode: &zero, NodeName: ptr.To("node-1"), Agent: agent,
		Isolation: &v1.IsolationStatus{Mechanism: ptr.To(v1.IsolationCgroup), LimitsEnforced: &enforced},
		StartTime: &now, CompletionTime: &now,
		Stdout: empty(), Stderr: empty(),
		LeftoverProcesses: &zero,
		Conditions: []metav1.Condition{scheduled,
			{Type: v1.ConditionRunning, Status: metav1.ConditionFalse, Reason: "Exited", Message: "the command exited", LastTransitionTime: now},
			{Type: v1.ConditionComplete, Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "the command exited with status 0", LastTransitionTime: now}},
	}
	return []v1.BashTaskStatus{ahead, done}
}

// printTable prints the table and returns whether a figure missed its target.
func printTable(o options, f figures) bool {
	type row struct {
		measure, figure, target string
		ok                      bool
		measured                bool
		noTarget                bool
	}
	var rows []row
	num := func(v float64, format string) string {
		if math.IsNaN(v) {
			return "not measured"
		}
		return fmt.Sprintf(format, v)
	}
	add := func(measure string, v float64, format, target string, ok bool) {
		rows = append(rows, row{measure: measure, figure: num(v, format), target: target, ok: ok, measured: !math.IsNaN(v)})
	}
	if f.executor != nil {
		plain := f.executor["executor.plain_write_mb_s"]
		add("executor.overhead_ratio", f.executor["executor.overhead_ratio"], "%.2f", "<= 1.30", f.executor["executor.overhead_ratio"] <= 1.30)
		add("executor.throughput_mb_s", f.executor["executor.throughput_mb_s"], "%.0f",
			fmt.Sprintf(">= 0.50 x plain write (%.0f)", plain), f.executor["executor.throughput_mb_s"] >= 0.5*plain)
		add("executor.rss_growth_mb", f.executor["executor.rss_growth_mb"], "%.1f", "< 32", f.executor["executor.rss_growth_mb"] < 32)
		if drain, ok := f.executor["executor.pipe_drain_mb_s"]; ok {
			add("executor.pipe_drain_mb_s", drain, "%.0f", "(the reference)", true)
			rows[len(rows)-1].noTarget = true
			target := ">= 0.75"
			if hash, ok := f.executor["executor.sha256_mb_s"]; ok && drain > 0 {
				// Every byte is hashed in order: the hash's speed bounds it.
				target += fmt.Sprintf(" (SHA-256 on one core: %.0f MB/s, %.2f)", hash, hash/drain)
			}
			add("executor.throughput_ratio", f.executor["executor.throughput_ratio"], "%.2f", target, f.executor["executor.throughput_ratio"] >= 0.75)
		}
		// The executor against the hash's own speed, measured in the same
		// rounds (issue 26): without and with a reader uploading the
		// spill file in parts behind the writer.
		for _, k := range []string{"executor.sha256_ratio", "executor.sha256_ratio_uploads"} {
			if v, ok := f.executor[k]; ok {
				add(k, v, "%.2f", ">= 0.90", v >= 0.90)
			}
		}
		if v, ok := f.executor["executor.stream_cpu_ms_per_gb"]; ok {
			add("executor.stream_cpu_ms_per_gb", v, "%.0f", fmt.Sprintf("(with part uploads: %.0f)", f.executor["executor.stream_cpu_ms_per_gb_uploads"]), true)
			rows[len(rows)-1].noTarget = true
		}
		if v, ok := f.executor["executor.tenant_task_cpu_ms"]; ok {
			add("executor.tenant_task_cpu_ms", v, "%.2f", fmt.Sprintf("(at the cgroup level: %.2f)", f.executor["executor.task_cpu_ms"]), true)
			rows[len(rows)-1].noTarget = true
		}
		// A task in a workspace against a plain tenant task of network
		// None (docs/workspaces.md): the median of the differences of the
		// pairs run in the same round.
		if v, ok := f.executor["executor.workspace_task_overhead_ms"]; ok {
			add("executor.workspace_task_overhead_ms", v, "%+.2f", fmt.Sprintf("<= +1.00 (against network Node: %+.2f)", f.executor["executor.workspace_task_overhead_node_ms"]), v <= 1)
		}
	}
	add("e2e.latency_p50_ms", f.latP50, "%.1f", "<= 30", f.latP50 <= 30)
	add("e2e.latency_p99_ms", f.latP99, "%.1f", "<= 150", f.latP99 <= 150)
	add("e2e.throughput_tasks_s", f.throughput, "%.1f", ">= 200", f.throughput >= 200)
	add("e2e.raw_api_tasks_s", f.raw, "%.1f", "(the reference)", true)
	rows[len(rows)-1].noTarget = true
	add("e2e.ratio_to_raw", f.ratio(), "%.2f", ">= 0.80", f.ratio() >= minRatioToRaw)
	add("e2e.ratio_to_raw_spread", f.ratioSpread(), "± %.2f", fmt.Sprintf("(over %d pairs)", len(f.ratios)), true)
	rows[len(rows)-1].noTarget = true
	add("e2e.apiserver_cpu_ms_per_task", f.apiCPU, "%.2f", "(raw API: "+num(f.rawAPICPU, "%.2f")+")", true)
	rows[len(rows)-1].noTarget = true
	add("e2e.writes_per_task", f.writesPerTask, "%.2f", "<= 3", f.writesPerTask <= 3)
	add("controller.rss_mb_10k", f.rssMB, "%.1f", fmt.Sprintf("< 300 (%d tasks)", o.rssTotal), f.rssMB < 300)
	add("workspace.create_ready_p50_ms", f.wsCreateP50, "%.1f", "<= 100 (p99 "+num(f.wsCreateP99, "%.1f")+")", f.wsCreateP50 <= 100)
	add("workspace.task_latency_p50_ms", f.wsTaskP50, "%.1f", "(plain task, same run: "+num(f.wsPlainP50, "%.1f")+")", true)
	rows[len(rows)-1].noTarget = true
	add("workspace.cp_download_mb_s", f.wsCopyMBps, "%.1f", ">= 50 (50 MiB, median of 3)", f.wsCopyMBps >= 50)
	if f.output != nil {
		out := func(k string) float64 {
			if v, ok := f.output[k]; ok {
				return v
			}
			return math.NaN()
		}
		add("output.latency_p50_ms", out("output.latency_p50_ms"), "%.1f", "<= 50", out("output.latency_p50_ms") <= 50)
		add("output.latency_p99_ms", out("output.latency_p99_ms"), "%.1f", "<= 250", out("output.latency_p99_ms") <= 250)
		add("output.throughput_mb_s", out("output.throughput_mb_s"), "%.0f", ">= 100 (one follower)", out("output.throughput_mb_s") >= 100)
		followers := fmt.Sprintf("%.0f followers of %.0f running tasks", out("output.followers"), out("output.followed_tasks"))
		add("output.followers_controller_rss_mb", out("output.followers_controller_rss_mb"), "%.1f", "< 300 ("+followers+")",
			out("output.followers_controller_rss_mb") < 300)
		add("output.followers_agent_rss_mb", out("output.followers_agent_rss_mb"), "%.1f", "(the agent, "+followers+")", true)
		rows[len(rows)-1].noTarget = true
		add("output.followers_latency_p50_ms", out("output.followers_latency_p50_ms"), "%.1f",
			"(p99 "+num(out("output.followers_latency_p99_ms"), "%.1f")+")", true)
		rows[len(rows)-1].noTarget = true
	}
	if f.resume != nil {
		res := func(k string) float64 {
			if v, ok := f.resume[k]; ok {
				return v
			}
			return math.NaN()
		}
		p50 := res("resume.first_task_p50_ms")
		add("resume.first_task_p50_ms", p50, "%.0f", fmt.Sprintf("<= 2000 (%.0f MiB; p90 %s, max %s, %.0f rounds)", res("resume.data_mib"),
			num(res("resume.first_task_p90_ms"), "%.0f"), num(res("resume.first_task_max_ms"), "%.0f"), res("resume.rounds")), p50 <= 2000)
	}

	fmt.Printf("\n== bashtask benchmark: %d CPUs, load average %s at start, %s at end\n", runtime.NumCPU(), f.loadStart, f.loadE)
	tw := report.NewTable(os.Stdout, false)
	fmt.Fprintf(tw, "measure\tfigure\ttarget\t\n")
	miss := false
	for _, r := range rows {
		verdict := "ok"
		switch {
		case !r.measured:
			verdict = "-"
		case r.noTarget:
			verdict = ""
		case !r.ok:
			verdict, miss = "MISS", true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.measure, r.figure, r.target, verdict)
	}
	_ = tw.Flush()
	return miss
}

// figuresOf are the phase's figures: the system's, and those of the other
// phases the table takes in, under their own keys.
func figuresOf(f figures) phase.Figures {
	m := phase.Figures{}
	if f.executor != nil {
		for _, k := range []string{"executor.overhead_ratio", "executor.throughput_mb_s", "executor.rss_growth_mb", "executor.pipe_drain_mb_s", "executor.throughput_ratio",
			"executor.sha256_mb_s", "executor.sha256_ratio", "executor.sha256_ratio_uploads", "executor.throughput_uploads_mb_s",
			"executor.stream_cpu_ms_per_gb", "executor.stream_cpu_ms_per_gb_uploads", "executor.task_cpu_ms", "executor.tenant_task_cpu_ms",
			"executor.workspace_task_overhead_ms", "executor.workspace_task_overhead_node_ms", "executor.workspace_create_disk_ms"} {
			if v, ok := f.executor[k]; ok {
				m[k] = v
			}
		}
	}
	put := func(k string, v float64) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m[k] = math.Round(v*100) / 100
		}
	}
	put("e2e.latency_p50_ms", f.latP50)
	put("e2e.latency_p99_ms", f.latP99)
	put("e2e.throughput_tasks_s", f.throughput)
	put("e2e.raw_api_tasks_s", f.raw)
	put("e2e.ratio_to_raw", f.ratio())
	put("e2e.ratio_to_raw_spread", f.ratioSpread())
	put("e2e.apiserver_cpu_ms_per_task", f.apiCPU)
	put("e2e.raw_apiserver_cpu_ms_per_task", f.rawAPICPU)
	put("e2e.writes_per_task", f.writesPerTask)
	put("controller.rss_mb_10k", f.rssMB)
	put("workspace.create_ready_p50_ms", f.wsCreateP50)
	put("workspace.create_ready_p99_ms", f.wsCreateP99)
	put("workspace.task_latency_p50_ms", f.wsTaskP50)
	put("workspace.plain_task_latency_p50_ms", f.wsPlainP50)
	put("workspace.cp_download_mb_s", f.wsCopyMBps)
	for _, k := range outputKeys {
		if v, ok := f.output[k]; ok {
			put(k, v)
		}
	}
	for _, k := range resumeKeys {
		if v, ok := f.resume[k]; ok {
			put(k, v)
		}
	}
	return m
}

// outputKeys are the figures of the output phase that the table and the
// JSON take over.
var outputKeys = []string{"output.latency_p50_ms", "output.latency_p99_ms", "output.throughput_mb_s",
	"output.followers", "output.followed_tasks", "output.followers_controller_rss_mb", "output.followers_agent_rss_mb",
	"output.followers_latency_p50_ms", "output.followers_latency_p99_ms"}

// resumeKeys are the figures of the resume phase that the JSON takes
// over; the table shows the first of them.
var resumeKeys = []string{"resume.first_task_p50_ms", "resume.first_task_p90_ms", "resume.first_task_max_ms",
	"resume.restore_p50_ms", "resume.data_mib", "resume.rounds"}

// joinFloats formats xs with format, comma-separated.
func joinFloats(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}

// reportLogErrors prints how many error lines each component logged, and
// the first few.
func reportLogErrors(dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		raw, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		var errs []string
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, "level=ERROR") || strings.Contains(line, `"level":"error"`) || strings.Contains(line, "\tERROR\t") {
				errs = append(errs, line)
			}
		}
		if len(errs) == 0 {
			continue
		}
		fmt.Printf("%s: %d error lines, first ones:\n", filepath.Base(l), len(errs))
		for _, e := range errs[:min(len(errs), 3)] {
			if len(e) > 300 {
				e = e[:300] + "…"
			}
			fmt.Printf("  %s\n", e)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
