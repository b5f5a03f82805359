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
// RSS under 1000 followers), the resume's (a Suspended workspace's
// resume until its first task starts) and the session's (one command
// through the plugin and the Go client); they are in the phase's JSON
// section too, under their own keys.
//
// The system runs on the shared local cluster of hack/bench
// (internal/rig/localcluster in this process: etcd, kube-apiserver, the
// controller and -agents agents as separate processes, a file:// bucket,
// loopback only), which the harness stops after the last phase that uses
// it, on error and on Ctrl-C.
package system

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
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
	resume map[string]float64
	// session holds the session phase's figures, by their keys.
	session          map[string]float64
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
	f.session = env.Results["session"]
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
