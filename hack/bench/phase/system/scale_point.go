package system

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/simagent"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
)

// scaleCluster is one point's cluster.
type scaleCluster struct {
	lc     *localcluster.Cluster
	dir    string
	cpPIDs []int
	log    *syncbuf.Buffer

	mu   sync.Mutex
	sims map[string]*simagent.Agent
	// mark and firstStart are Unix nanoseconds: the first Start a
	// simulated agent admitted after mark.
	mark, firstStart atomic.Int64
}

// startScaleCluster starts a point's cluster: real agent processes at the
// process level, or simulated agents in this process.
func startScaleCluster(ctx context.Context, o scaleOptions, co phase.ClusterOptions, pt scalePoint, dir string) (*scaleCluster, error) {
	sc := &scaleCluster{dir: dir, log: &syncbuf.Buffer{}, sims: map[string]*simagent.Agent{}}
	lo := localcluster.LauncherOptions{
		Dir: dir, BinDir: co.BinDir, AssetsDir: co.AssetsDir, CRDDir: co.CRDDir, AdmissionDir: co.AdmissionDir,
		Agents: pt.agents, Isolation: "process",
		ControllerArgs: append([]string{"--agent-lost-after=" + o.agentLostAfter.String()}, co.ControllerArgs...),
		AgentArgs:      append([]string{"--max-concurrent-tasks=" + strconv.Itoa(o.capacity)}, co.AgentArgs...),
		Log:            slog.New(slog.NewTextHandler(sc.log, nil)),
	}
	if pt.simulated {
		lo.AgentServer = func(a localcluster.Agent, listen string, certs *localcluster.Certs) (io.Closer, error) {
			s, err := simagent.Start(simagent.Options{Node: a.Node, Listen: listen, TLS: certs.Agent,
				ClientIdentity: localcluster.ControllerIdentity, Capacity: o.capacity, ShortDelay: o.shortDelay, OnStart: sc.onStart})
			if err == nil {
				sc.mu.Lock()
				sc.sims[a.Node] = s
				sc.mu.Unlock()
			}
			return s, err
		}
	}
	before := phase.ControlPlaneChildren()
	start := time.Now()
	lc, err := localcluster.Up(ctx, lo)
	if err != nil {
		localcluster.WriteLogTails(os.Stderr, dir, 15)
		return nil, fmt.Errorf("starting the cluster of %d agents: %w", pt.agents, err)
	}
	sc.lc = lc
	for _, pid := range phase.ControlPlaneChildren() {
		if !slices.Contains(before, pid) {
			sc.cpPIDs = append(sc.cpPIDs, pid)
		}
	}
	fmt.Printf("cluster up in %s in %s\n", time.Since(start).Round(100*time.Millisecond), dir)
	return sc, nil
}

func (sc *scaleCluster) onStart(string) {
	if m := sc.mark.Load(); m > 0 {
		sc.firstStart.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// down stops the cluster, printing its components' restarts and errors.
func (sc *scaleCluster) down(failed bool) {
	if failed {
		localcluster.WriteLogTails(os.Stderr, sc.dir, 15)
	}
	sc.lc.Down()
	for _, line := range splitLines(sc.log.String()) {
		if containsAny(line, "Restart", "Exited", "level=ERROR", "killed") {
			fmt.Printf("launcher: %s\n", line)
		}
	}
}

// runPoint runs one point on a cluster of its own.
func runPoint(ctx context.Context, o scaleOptions, co phase.ClusterOptions, pt scalePoint) (r scaleRow, err error) {
	r = newRow(pt)
	tmp, dir, err := pointDir(pt)
	if err != nil {
		return r, err
	}
	sc, err := startScaleCluster(ctx, o, co, pt, dir)
	if err != nil {
		return r, err
	}
	defer func() {
		sc.down(err != nil)
		if err != nil || o.keep {
			fmt.Fprintf(os.Stderr, "bench: the point's logs are kept in %s\n", dir)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	cfg, err := clientcmd.BuildConfigFromFlags("", sc.lc.Kubeconfig)
	if err != nil {
		return r, err
	}
	b, err := newBench(ctx, cfg, options{qps: 1000, burst: 2000, stall: o.stall})
	if err != nil {
		return r, err
	}
	defer b.close()
	var wsNames []string
	if pt.simulated && o.workspaces > 0 {
		if wsNames, r.wsReadyS, err = b.makeWorkspaces(ctx, o, o.workspaces); err != nil {
			return r, err
		}
		r.workspaces = len(wsNames)
	}
	if err := sc.measureTasks(ctx, b, o, pt, wsNames, &r); err != nil {
		return r, err
	}
	if err := sc.leaderRestart(ctx, b, o, pt, &r); err != nil {
		return r, err
	}
	if pt.simulated && len(wsNames) > 0 {
		if err := sc.nodeLoss(ctx, b, o, &r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// taskSpec is the i-th task's spec: every longEvery-th `sleep`, else
// `true`; every wsEvery-th (when there are workspaces) in one of them.
func taskSpec(o scaleOptions, i int, ws []string) v1.BashTaskSpec {
	spec := v1.BashTaskSpec{Command: "true"}
	if o.longEvery > 0 && i%o.longEvery == o.longEvery-1 {
		spec.Command = "sleep " + strconv.FormatFloat(o.longSeconds, 'f', -1, 64)
	}
	if o.wsEvery > 0 && len(ws) > 0 && i%o.wsEvery == 0 {
		spec.Workspace = ptr.To(ws[(i/o.wsEvery)%len(ws)])
	}
	return spec
}

func (b *bench) createSpec(ctx context.Context, name string, spec v1.BashTaskSpec) error {
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: spec}
	if err := b.c.Create(ctx, bt); err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	now := time.Now()
	b.mu.Lock()
	b.created[name] = now
	b.mu.Unlock()
	return nil
}

// steady creates the named tasks at rate per second, each create in a
// goroutine of its own so that a slow call does not delay the next, calls
// mid once half of them were created, and waits until every one is
// terminal.
func (b *bench) steady(ctx context.Context, names []string, rate float64, spec func(int) v1.BashTaskSpec, mid func(), deadline time.Time) error {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for i, name := range names {
		if i > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return ctx.Err()
			case <-tick.C:
			}
		}
		if i == len(names)/2 && mid != nil {
			mid()
		}
		if err, _ := firstErr.Load().(error); err != nil {
			break
		}
		wg.Go(func() {
			if err := b.createSpec(ctx, name, spec(i)); err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return b.waitTerminal(ctx, names, deadline, "scale")
}

// measureTasks runs the point's tasks at the steady rate and fills the
// row's throughput, latency, CPU, writes, RSS and etcd figures.
func (sc *scaleCluster) measureTasks(ctx context.Context, b *bench, o scaleOptions, pt scalePoint, ws []string, r *scaleRow) error {
	names := make([]string, pt.tasks)
	for i := range names {
		names[i] = fmt.Sprintf("s-%06d", i)
	}
	procs := components(sc.dir, sc.cpPIDs)
	reqBefore, err := b.apiRequests(ctx)
	if err != nil {
		return err
	}
	var prof func()
	mid := func() {
		if o.profileDir != "" {
			prof = b.startProfiles(ctx, procs, o.profileDir+"/"+pt.String(), o.profileFor)
		}
	}
	c0 := snapshotCPU(procs)
	start := time.Now()
	fmt.Printf("%d tasks at %.0f/s (every %dth long, every %dth in a workspace of %d)\n", pt.tasks, o.rate, o.longEvery, o.wsEvery, len(ws))
	deadline := start.Add(time.Duration(float64(pt.tasks)/o.rate*float64(time.Second)) + 30*time.Minute)
	if err := b.steady(ctx, names, o.rate, func(i int) v1.BashTaskSpec { return taskSpec(o, i, ws) }, mid, deadline); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the trailing writes (forget, uploads) count with the tasks
	c1 := snapshotCPU(procs)
	if prof != nil {
		prof()
	}
	reqAfter, err := b.apiRequests(ctx)
	if err != nil {
		return err
	}
	b.printReasons("s-")
	var cpu cpuTotal
	cpu.add(c0, c1)
	cpu.print("point "+pt.String(), pt.tasks)
	counts := reqAfter.minus(reqBefore)
	counts.setN(pt.tasks)
	counts.print()
	lat := b.latencies(names)
	r.tps = float64(pt.tasks) / b.lastTerminal(names).Sub(start).Seconds()
	r.p50, r.p99 = stats.Percentile(lat, 0.50), stats.Percentile(lat, 0.99)
	r.ctrlCPUms = cpu.msPerTask("controller", pt.tasks)
	r.apiCPUms = cpu.msPerTask("kube-apiserver", pt.tasks)
	r.etcdCPUms = cpu.msPerTask("etcd", pt.tasks)
	r.writes = counts.perTask(isTaskWrite)
	if rss, _, _, err := controllerRSS(sc.dir); err == nil {
		r.rssMiB = rss
	}
	r.etcdDBMiB = sc.etcdDBMiB(ctx)
	fmt.Printf("point %s: %.1f tasks/s, p50 %.0f ms, p99 %.0f ms, controller %.2f ms CPU and %.2f writes per task, RSS %.0f MiB, etcd db %.1f MiB\n",
		pt, r.tps, r.p50, r.p99, r.ctrlCPUms, r.writes, r.rssMiB, r.etcdDBMiB)
	return nil
}

// latencies are the create→terminal times of names, in ms.
func (b *bench) latencies(names []string) []float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]float64, 0, len(names))
	for _, n := range names {
		out = append(out, max(float64(b.terminal[n].Sub(b.created[n]))/float64(time.Millisecond), 0))
	}
	return out
}

// etcdDBMiB is etcd's etcd_mvcc_db_total_size_in_bytes in MiB, NaN when
// its metrics cannot be read.
func (sc *scaleCluster) etcdDBMiB(ctx context.Context) float64 {
	u := sc.lc.ControlPlane().Env.ControlPlane.Etcd.URL
	if u == nil {
		return nan()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := httpGet(ctx, u.String()+"/metrics")
	if err != nil {
		fmt.Printf("etcd metrics: %v\n", err)
		return nan()
	}
	for _, s := range parseMetric(raw, "etcd_mvcc_db_total_size_in_bytes") {
		return s.value / (1 << 20)
	}
	return nan()
}

// listAll lists the namespace's objects of list's kind in pages.
func listAll(ctx context.Context, c client.Client, list client.ObjectList, each func()) error {
	cont := ""
	for {
		if err := c.List(ctx, list, client.InNamespace(namespace), client.Limit(2000), client.Continue(cont)); err != nil {
			return err
		}
		each()
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}
