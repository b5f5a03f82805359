// Package output is the output phase of hack/bench (formerly
// hack/bench-output). It measures the output API (docs/output.md) on the
// shared local cluster of hack/bench (internal/rig/localcluster, file://
// objects); every task of the phase runs on the cluster's first agent
// (spec.nodeName), whose figures are "the agent's":
//
//   - latency: a command prints its clock ($EPOCHREALTIME, no fork) on a
//     line every 10 ms; a client follows bashtasks/log through
//     kube-apiserver and takes, per line, its arrival time minus the time
//     in it (same host, same clock). Targets: p50 <= 50 ms, p99 <= 250 ms.
//   - many followers: -followed-tasks (100) running tasks print their clock
//     on a line every 100 ms, and -followers-per-task (10) clients follow
//     each through kube-apiserver, 1000 at once, spread over
//     -follower-connections HTTP/2 connections (kube-apiserver allows 250
//     streams on one). Once every follower has its first line and
//     -follow-settle (5 s) has passed, for the lines written before they
//     connected, the controller's and the agent's VmRSS are sampled every
//     250 ms for -follow-window, with their VmHWM reset at the phase's
//     start; the peak of each is the figure (target: the controller under
//     300 MiB), with the line delays the followers saw in the window and
//     the CPU each process used. It runs before the throughput phase,
//     whose buffers would stay in the heaps.
//   - throughput: one follower of a stream of -bytes (1 GiB) written at
//     once, from its first byte to the end. Target: >= 100 MB/s.
//
// A part whose count is 0 (-lines, -bytes, -followed-tasks) is skipped.
// The figures are the phase's JSON section; the system phase's table
// takes them in.
//
// Run with `go run ./hack/bench -phases=output` after `make build` and
// with the control-plane binaries in bin/k8s.
package output

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

type options struct {
	lines                           int
	size                            int64
	followedTasks, followersPerTask int
	connections                     int
	window, settle                  time.Duration
}

// Phase is the output phase.
type Phase struct{ o options }

// Name is "output".
func (*Phase) Name() string { return "output" }

// Flags registers the flags of the former hack/bench-output but those of
// its cluster (-bin-dir, -assets-dir, -crd-dir, -isolation, -keep), which
// are hack/bench's own now.
func (p *Phase) Flags(fs *flag.FlagSet) {
	o := &p.o
	fs.IntVar(&o.lines, "lines", 1000, "timestamped lines of the latency phase, one per 10 ms (0 skips the phase)")
	fs.Int64Var(&o.size, "bytes", 1<<30, "bytes of the throughput phase's stream (0 skips the phase)")
	fs.IntVar(&o.followedTasks, "followed-tasks", 100, "running tasks of the many-followers phase (0 skips the phase)")
	fs.IntVar(&o.followersPerTask, "followers-per-task", 10, "follow=true clients of each task in the many-followers phase")
	fs.IntVar(&o.connections, "follower-connections", 10, "HTTP/2 connections (transports) the followers are spread over")
	fs.DurationVar(&o.window, "follow-window", 20*time.Second, "how long the memory is sampled once every follower receives")
	fs.DurationVar(&o.settle, "follow-settle", 5*time.Second, "wait between every follower's first line and the window, for the lines written before they connected")
}

// Configure raises the agents' running tasks for the many-followers part:
// the agent's default of 16, raised for the part's tasks and the other
// parts' one each.
func (p *Phase) Configure(o *phase.ClusterOptions) {
	if p.o.followedTasks > 0 {
		o.MaxConcurrentTasks = max(o.MaxConcurrentTasks, 16, p.o.followedTasks+2)
	}
}

// Run measures the output API on the shared cluster.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	o := p.o
	c, err := env.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	scheme, err := localcluster.NewScheme()
	if err != nil {
		return nil, err
	}
	k8s, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	oc, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	b := &bench{dir: c.Dir, cfg: cfg, k8s: k8s, oc: oc, node: c.Agents[0].Node, apiservers: c.ControlPlanePIDs, f: phase.Figures{}}
	if o.lines > 0 {
		if err := b.latency(ctx, o.lines); err != nil {
			return b.f, fmt.Errorf("latency: %w", err)
		}
	}
	// The followers before the throughput: the gigabyte's buffers stay
	// in the processes' heaps a while, and the followers' figure is
	// their memory, not what the throughput left behind.
	if o.followedTasks > 0 {
		if err := b.followers(ctx, o); err != nil {
			return b.f, fmt.Errorf("many followers: %w", err)
		}
	}
	if o.size > 0 {
		if err := b.throughput(ctx, o.size); err != nil {
			return b.f, fmt.Errorf("throughput: %w", err)
		}
	}
	return b.f, nil
}

// bench is a run on one local cluster.
type bench struct {
	dir  string
	cfg  *rest.Config
	k8s  ctrlclient.Client
	oc   *client.Client
	node string
	// apiservers are the cluster's control-plane processes.
	apiservers []int
	f          phase.Figures
}

// clockLines is a command printing $EPOCHREALTIME on a line every interval
// (in seconds), count times, or until it is cancelled when count is 0. The
// wait is bash's read with a timeout on a FIFO the shell holds open for
// reading and writing, so no line costs a fork (sleep would, and a hundred
// tasks forking ten times a second load two cores on their own).
func clockLines(count int, interval string) string {
	cond := fmt.Sprintf("i < %d", count)
	if count == 0 {
		cond = ""
	}
	return fmt.Sprintf(`mkfifo .tick && exec 3<>.tick && rm .tick; for ((i = 0; %s; i++)); do printf '%%s\n' "$EPOCHREALTIME"; read -r -t %s -u 3; done`, cond, interval)
}

// lineDelay is the time from the clock in line to now.
func lineDelay(line string, now time.Time) (time.Duration, error) {
	sec, frac, _ := strings.Cut(line, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("line %q is not $EPOCHREALTIME", line)
	}
	return now.Sub(time.Unix(s, us*1000)), nil
}

// quantile is the p-percentile of sorted durations
// (stats.PercentileDuration).
func quantile(sorted []time.Duration, p float64) time.Duration {
	return stats.PercentileDuration(sorted, p)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) latency(ctx context.Context, lines int) error {
	lat := &v1.BashTask{}
	lat.Namespace, lat.Name = "default", "bench-latency"
	lat.Spec.NodeName = ptr.To(b.node)
	lat.Spec.Command = clockLines(lines, "0.01")
	if err := b.k8s.Create(ctx, lat); err != nil {
		return err
	}
	r, err := b.oc.FollowLog(ctx, lat.Namespace, lat.Name, client.LogOptions{Follow: true})
	if err != nil {
		return err
	}
	var delays []time.Duration
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		d, err := lineDelay(sc.Text(), time.Now())
		if err != nil {
			return err
		}
		delays = append(delays, d)
	}
	_ = r.Close()
	if err := sc.Err(); err != nil {
		return err
	}
	if len(delays) != lines {
		return fmt.Errorf("%d lines of %d", len(delays), lines)
	}
	slices.Sort(delays)
	round := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	fmt.Printf("write-to-client latency over %d lines (10 ms apart): p50 %s, p90 %s, p99 %s, max %s (targets: p50 <= 50ms, p99 <= 250ms)\n",
		len(delays), round(quantile(delays, 0.50)), round(quantile(delays, 0.90)), round(quantile(delays, 0.99)), round(delays[len(delays)-1]))
	b.f["output.latency_p50_ms"] = ms(quantile(delays, 0.50))
	b.f["output.latency_p99_ms"] = ms(quantile(delays, 0.99))
	return nil
}

func (b *bench) throughput(ctx context.Context, size int64) error {
	tp := &v1.BashTask{}
	tp.Namespace, tp.Name = "default", "bench-throughput"
	tp.Spec.NodeName = ptr.To(b.node)
	tp.Spec.Command = fmt.Sprintf(`head -c %d /dev/zero`, size)
	tp.Spec.Output = &v1.OutputSpec{SpillLimitBytes: ptr.To(size), Upload: ptr.To(v1.UploadNever)}
	if err := b.k8s.Create(ctx, tp); err != nil {
		return err
	}
	r, err := b.oc.FollowLog(ctx, tp.Namespace, tp.Name, client.LogOptions{Follow: true})
	if err != nil {
		return err
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(r, first); err != nil {
		return err
	}
	procs, err := b.procs()
	if err != nil {
		return err
	}
	for _, p := range procs {
		p.cpu0 = cpuTicks(p.pid)
	}
	start := time.Now()
	n, err := io.CopyBuffer(io.Discard, r, make([]byte, 1<<20))
	took := time.Since(start)
	var cpu []string
	for _, p := range procs {
		cpu = append(cpu, fmt.Sprintf("%s %.2f", p.name, float64(cpuTicks(p.pid)-p.cpu0)/procfs.ClockTicks))
	}
	_ = r.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if n+1 != size {
		return fmt.Errorf("followed %d bytes of %d", n+1, size)
	}
	mbs := float64(n) / took.Seconds() / 1e6
	fmt.Printf("one follower of a %d-byte stream: %.0f MB/s (%s from its first byte; target >= 100 MB/s)\n", size, mbs, took.Round(time.Millisecond))
	// The agent's figure includes the capture (hashing, the spill file),
	// which runs at the same time.
	fmt.Printf("CPU seconds meanwhile: %s\n", strings.Join(cpu, ", "))
	b.f["output.throughput_mb_s"] = mbs
	return nil
}

// follower is one follow=true client of the many-followers phase.
type follower struct {
	task  string
	bytes atomic.Int64
	// got is closed at its first line, done when it ended, with err.
	got, done chan struct{}
	once      sync.Once
	err       error
}

// proc is a process whose memory and CPU the many-followers phase reads.
type proc struct {
	name string
	pid  int
	peak int64 // the largest VmRSS sampled, in bytes
	cpu0 int64 // user and system clock ticks at the window's start
}

func (b *bench) pid(name string) (int, error) {
	raw, err := os.ReadFile(filepath.Join(b.dir, "pids", name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(raw)))
}

// procs lists the controller, the agent, kube-apiserver and this process,
// in that order.
func (b *bench) procs() ([]*proc, error) {
	var procs []*proc
	for _, name := range []string{"controller", "agent-" + b.node} {
		pid, err := b.pid(name)
		if err != nil {
			return nil, fmt.Errorf("the %s's pid: %w", name, err)
		}
		procs = append(procs, &proc{name: name, pid: pid})
	}
	if pid := childNamed("kube-apiserver", b.apiservers); pid != 0 {
		procs = append(procs, &proc{name: "kube-apiserver", pid: pid})
	}
	return append(procs, &proc{name: "bench (client)", pid: os.Getpid()}), nil
}

func cpuTicks(pid int) int64 {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.UTime + st.STime
}

// followers runs the many-followers phase.
func (b *bench) followers(ctx context.Context, o options) error {
	n := o.followedTasks * o.followersPerTask
	fmt.Printf("\n== %d followers of %d running tasks (a line every 100 ms each), over %d connections\n", n, o.followedTasks, o.connections)
	procs, err := b.procs()
	if err != nil {
		return err
	}
	for _, p := range procs[:2] {
		// The other phases' peaks are not this one's.
		if err := procfs.ResetPeak(p.pid); err != nil {
			fmt.Printf("resetting the peak RSS of the %s: %v (VmHWM covers the whole run)\n", p.name, err)
		}
	}

	// Several transports: one HTTP/2 connection to kube-apiserver carries
	// at most 250 streams (its --http2-max-streams-per-connection default,
	// Go's), and the test should not depend on the transport opening more.
	clients := make([]*client.Client, o.connections)
	for i := range clients {
		cfg := rest.CopyConfig(b.cfg)
		// A Dial of its own keeps client-go from sharing one cached
		// transport between the clients.
		cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		c, err := client.New(cfg)
		if err != nil {
			return err
		}
		clients[i] = c
	}

	tasks := make([]string, o.followedTasks)
	for i := range tasks {
		tasks[i] = fmt.Sprintf("bench-follow-%03d", i)
		bt := &v1.BashTask{}
		bt.Namespace, bt.Name = "default", tasks[i]
		bt.Spec.NodeName = ptr.To(b.node)
		bt.Spec.Command = clockLines(0, "0.1")
		if err := b.k8s.Create(ctx, bt); err != nil {
			return err
		}
	}
	defer func() {
		// The tasks run until cancelled.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, name := range tasks {
			_ = b.oc.Cancel(cctx, "default", name, "")
		}
	}()

	fctx, stopFollowers := context.WithCancel(ctx)
	defer stopFollowers()
	var inWindow atomic.Bool
	var mu sync.Mutex
	var delays []time.Duration
	fs := make([]*follower, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range fs {
		f := &follower{task: tasks[i%len(tasks)], got: make(chan struct{}), done: make(chan struct{})}
		fs[i] = f
		c := clients[i%len(clients)]
		wg.Go(func() {
			defer close(f.done)
			f.err = follow(fctx, c, f, func(d time.Duration) {
				if inWindow.Load() {
					mu.Lock()
					delays = append(delays, d)
					mu.Unlock()
				}
			})
		})
	}
	defer wg.Wait()
	defer stopFollowers()

	deadline := time.After(5 * time.Minute)
	for i, f := range fs {
		select {
		case <-f.got:
		case <-f.done:
			return fmt.Errorf("follower %d (of %s) ended before its first line: %w", i, f.task, f.err)
		case <-deadline:
			return fmt.Errorf("follower %d (of %s) had no line 5 minutes after the start", i, f.task)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Printf("every follower received its first line %s after the tasks' creation\n", time.Since(start).Round(time.Millisecond))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(o.settle):
	}

	before := make([]int64, n)
	for i, f := range fs {
		before[i] = f.bytes.Load()
	}
	for _, p := range procs {
		p.cpu0 = cpuTicks(p.pid)
	}
	wStart := time.Now()
	inWindow.Store(true)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for end := wStart.Add(o.window); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		for _, p := range procs {
			if m, err := procfs.ReadMemory(p.pid); err == nil {
				p.peak = max(p.peak, m.RSS)
			}
		}
	}
	inWindow.Store(false)
	wall := time.Since(wStart)
	receiving := 0
	var got int64
	for i, f := range fs {
		d := f.bytes.Load() - before[i]
		got += d
		if d > 0 {
			receiving++
		}
	}
	fmt.Printf("in the %s window: %d of %d followers received lines, %.1f kB/s in all\n", o.window, receiving, n, float64(got)/wall.Seconds()/1e3)
	if receiving < n {
		for i, f := range fs {
			select {
			case <-f.done:
				return fmt.Errorf("%d of %d followers received nothing in the window; follower %d (of %s) ended: %w", n-receiving, n, i, f.task, f.err)
			default:
			}
		}
		return fmt.Errorf("%d of %d followers received nothing in the window", n-receiving, n)
	}
	mu.Lock()
	slices.Sort(delays)
	if len(delays) > 0 {
		fmt.Printf("line delays seen by the followers in the window (%d lines): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			len(delays), ms(quantile(delays, 0.5)), ms(quantile(delays, 0.99)), ms(delays[len(delays)-1]))
		b.f["output.followers_latency_p50_ms"] = ms(quantile(delays, 0.5))
		b.f["output.followers_latency_p99_ms"] = ms(quantile(delays, 0.99))
	}
	mu.Unlock()
	for _, p := range procs {
		m, err := procfs.ReadMemory(p.pid)
		if err != nil {
			return fmt.Errorf("the %s's memory: %w", p.name, err)
		}
		cores := float64(cpuTicks(p.pid)-p.cpu0) / procfs.ClockTicks / wall.Seconds()
		fmt.Printf("%-16s pid %-7d peak VmRSS sampled %6.1f MiB, VmHWM %6.1f MiB, VmRSS now %6.1f MiB, CPU %.2f cores\n",
			p.name, p.pid, mib(p.peak), mib(m.HWM), mib(m.RSS), cores)
		switch p.name {
		case "controller":
			b.f["output.followers_controller_rss_mb"] = mib(max(p.peak, m.HWM))
		case "agent-" + b.node:
			b.f["output.followers_agent_rss_mb"] = mib(max(p.peak, m.HWM))
		}
	}
	b.f["output.followers"], b.f["output.followed_tasks"] = float64(n), float64(o.followedTasks)
	fmt.Printf("%d followers: controller peak RSS %.1f MiB (target < 300 MiB), agent peak RSS %.1f MiB\n",
		n, b.f["output.followers_controller_rss_mb"], b.f["output.followers_agent_rss_mb"])
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// follow reads the task's stdout with follow=true until ctx ends, counting
// its bytes and passing each line's delay to onLine.
func follow(ctx context.Context, c *client.Client, f *follower, onLine func(time.Duration)) error {
	r, err := c.FollowLog(ctx, "default", f.task, client.LogOptions{Follow: true})
	if err != nil {
		return err
	}
	defer r.Close()
	br := bufio.NewReaderSize(r, 4096)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		now := time.Now()
		f.bytes.Add(int64(len(line)))
		f.once.Do(func() { close(f.got) })
		if d, err := lineDelay(strings.TrimSuffix(line, "\n"), now); err == nil {
			onLine(d)
		}
	}
}

// childNamed returns the pid among pids (the cluster's control plane)
// named comm, 0 when there is none.
func childNamed(comm string, pids []int) int {
	for _, pid := range pids {
		if name, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); err == nil && strings.TrimSpace(string(name)) == comm {
			return pid
		}
	}
	return 0
}
