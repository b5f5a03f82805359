// Command chaos runs the whole system under a mix of faults and checks,
// from evidence the controller does not write itself, that no task ran
// twice, no status went backwards, no output was lost and nothing was
// left behind.
//
// It starts a local cluster of processes through localcluster's launcher,
// the one bashtask-local and the e2e suite use (etcd and kube-apiserver
// from bin/k8s, versitygw, five agents behind TCP proxies, two
// controllers with leader election and short lease settings), creates a steady mix of
// tasks, and injects faults one after the other at random times: SIGKILL
// or SIGSTOP of the leading controller, SIGKILL of an agent, of
// kube-apiserver or of the S3 server (each restarted after a random
// delay), SIGSTOP of etcd or of the S3 server, and an agent cut off the
// network for longer than --agent-lost-after. Every choice comes from one
// seed, printed first; CHAOS_SEED=<seed> replays the same plan (the
// system's timing still varies).
//
// The evidence: the commands record their own starts in a shared
// directory and the agents log theirs; a watch of every BashTask from
// before the first was created; the objects in the bucket; the processes
// alive and the agents' records at the end. The invariants are printed as
// a table; the command exits 1 when any fails, naming the task and the
// evidence. docs/chaos.md describes the profiles and the settings.
//
// Environment: CHAOS_SEED (default: random), CHAOS_DURATION (length of
// the workload and fault phase, default 2m), CHAOS_RATE (tasks created per
// second, default 2), CHAOS_SLACK (added to every deadline, default 20s),
// CHAOS_KEEP=1 (keep the run's directory even when it passed).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
)

const namespace = "chaos"

// The agents: node-1 to node-3 at the process level run the plain tasks,
// node-4 and node-5 at the tenant level the workspaces.
const (
	processAgents = 3
	tenantAgents  = 2
)

// config is a run's profile, from the environment.
type config struct {
	seed     uint64
	duration time.Duration
	rate     float64
	slack    time.Duration
	keep     bool
	drain    time.Duration
	set      settings
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as 30m", name, v)
	}
	return d, nil
}

func loadConfig() (config, error) {
	c := config{
		rate: 2,
		set: settings{
			leaseDuration: 6 * time.Second, renewDeadline: 4 * time.Second, retryPeriod: time.Second,
			agentLostAfter: 10 * time.Second, ownerLimit: 2,
		},
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return c, fmt.Errorf("CHAOS_SEED=%q: want an unsigned decimal integer", v)
		}
		c.seed = s
	} else {
		c.seed = rand.Uint64() % 1_000_000_000
	}
	var err error
	if c.duration, err = envDuration("CHAOS_DURATION", 3*time.Minute); err != nil {
		return c, err
	}
	if c.slack, err = envDuration("CHAOS_SLACK", 20*time.Second); err != nil {
		return c, err
	}
	if v := os.Getenv("CHAOS_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 || r > 50 {
			return c, fmt.Errorf("CHAOS_RATE=%q: want tasks per second between 0 and 50", v)
		}
		c.rate = r
	}
	c.keep = os.Getenv("CHAOS_KEEP") == "1"
	// Long enough for the longest task (60 s), a partition and an upload
	// backoff after the last fault.
	c.drain = 4 * time.Minute
	return c, nil
}

func main() {
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	fmt.Printf("chaos: seed %d (replay with CHAOS_SEED=%d make test-chaos)\n", cfg.seed, cfg.seed)
	// envtest logs through controller-runtime's logger; not part of the
	// output.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, cfg)
	stop()
	os.Exit(code)
}

func logf(format string, args ...any) {
	fmt.Printf("%s %s\n", time.Now().UTC().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, cfg config) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	loc := locations{
		binDir:       filepath.Join(root, "bin"),
		assetsDir:    envOr("KUBEBUILDER_ASSETS", filepath.Join(root, "bin", "k8s")),
		crdDir:       filepath.Join(root, "config", "crd", "bases"),
		admissionDir: filepath.Join(root, "config", "admission"),
	}
	tasksRNG := rand.New(rand.NewPCG(cfg.seed, 1))
	faultsRNG := rand.New(rand.NewPCG(cfg.seed, 2))
	plan := planWorkload(tasksRNG, cfg.duration, cfg.rate)
	// More faults than fit; the phase's end cuts the list.
	faultPlan := planFaults(faultsRNG, cfg.set, 1000)
	logf("profile: %s of workload and faults, %d tasks, lease %s/%s/%s, agent-lost-after %s, owner limit %d, slack %s",
		cfg.duration, len(plan), cfg.set.leaseDuration, cfg.set.renewDeadline, cfg.set.retryPeriod, cfg.set.agentLostAfter, cfg.set.ownerLimit, cfg.slack)

	tmp, err := os.MkdirTemp("", "bashtask-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	dir := filepath.Join(tmp, "cluster")
	startsDir := filepath.Join(tmp, "starts")
	if err := os.MkdirAll(startsDir, 0o777); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	failed := true
	defer func() {
		if failed || cfg.keep {
			fmt.Printf("chaos: logs, agent state and start records kept in %s\n", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()

	c, err := startCluster(ctx, dir, loc, cfg.set, logf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: starting the cluster:", err)
		localcluster.WriteLogTails(os.Stderr, dir, 20)
		return 2
	}
	defer func() {
		logf("stopping the cluster")
		c.stop()
	}()
	e, err := exercise(ctx, cfg, c, plan, faultPlan, startsDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		localcluster.WriteLogTails(os.Stderr, dir, 20)
		return 2
	}
	results := Check(e)
	report(os.Stdout, cfg, e, results)
	if raw, err := json.MarshalIndent(e, "", " "); err == nil {
		// Every observation of every task, for reading a failure.
		_ = os.WriteFile(filepath.Join(tmp, "evidence.json"), raw, 0o600)
	}
	if Failed(results) {
		fmt.Printf("chaos: FAILED; replay with CHAOS_SEED=%d\n", cfg.seed)
		return 1
	}
	failed = false
	fmt.Printf("chaos: passed (seed %d)\n", cfg.seed)
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// exercise runs the workload and the faults, drains, and collects the
// evidence.
func exercise(ctx context.Context, cfg config, c *cluster, plan []plannedTask, faultPlan []plannedFault, startsDir string) (*Evidence, error) {
	restCfg := *c.cp.Config
	restCfg.QPS, restCfg.Burst = 200, 400
	k8s, err := client.NewWithWatch(&restCfg, client.Options{Scheme: c.cp.Scheme})
	if err != nil {
		return nil, err
	}
	runID := strconv.FormatUint(cfg.seed, 10) + "-" + strconv.Itoa(os.Getpid())
	w := &workload{c: k8s, ns: namespace, runID: runID, startsDir: startsDir, log: logf, tasks: map[string]*TaskInfo{}}
	if err := w.prepare(ctx); err != nil {
		return nil, err
	}
	rec, err := newRecorder(ctx, c.cp.Env.ControlPlane.Etcd.URL.String(), namespace)
	if err != nil {
		return nil, err
	}
	w.rec = rec
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go rec.run(watchCtx)
	bc, err := newBeacon()
	if err != nil {
		return nil, err
	}
	ws := &workspaces{w: w, names: []string{"ws-a", "ws-b"}, beacon: bc, obs: map[string][]WorkspaceObservation{},
		rng: rand.New(rand.NewPCG(cfg.seed, 0x5eed))}
	if err := ws.create(ctx); err != nil {
		return nil, err
	}

	start := time.Now()
	logf("workload and faults start")
	phaseCtx, endPhase := context.WithTimeout(ctx, cfg.duration)
	defer endPhase()
	in := &injector{c: c, ws: ws, log: logf}
	faultsDone := make(chan struct{})
	go func() { defer close(faultsDone); in.run(phaseCtx, faultPlan) }()
	// The workload's calls (creates, cancels, deletes) go on past the
	// phase, through the drain.
	drainCtx, endDrain := context.WithTimeout(ctx, cfg.duration+cfg.drain)
	defer endDrain()
	wsDone := make(chan struct{})
	go func() { defer close(wsDone); ws.run(phaseCtx, drainCtx) }()
	w.run(phaseCtx, drainCtx, plan, start)
	<-phaseCtx.Done()
	<-faultsDone
	c.recover()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	logf("faults stopped after %d injections; draining (up to %s)", len(in.windows()), cfg.drain)

	deletedUIDs := func() []string {
		var out []string
		for _, t := range w.infos() {
			if t.Deleted && t.UID != "" {
				out = append(out, t.UID)
			}
		}
		return out
	}
	lastLog := time.Now()
	for {
		pending := rec.unsettled(w.infos())
		held := heldDeleted(drainCtx, c, deletedUIDs())
		if len(pending) == 0 && len(held) == 0 {
			break
		}
		if drainCtx.Err() != nil {
			logf("drain ended with %d tasks unsettled and %d deleted tasks held by agents", len(pending), len(held))
			break
		}
		if time.Since(lastLog) > 15*time.Second {
			logf("draining: %d tasks not terminal or upload pending (%s), %d deleted tasks held by agents",
				len(pending), strings.Join(first(pending, 5), " "), len(held))
			lastLog = time.Now()
		}
		sleepCtx(drainCtx, time.Second)
	}
	w.wg.Wait()
	endDrain()
	<-wsDone
	// Leftover processes get their grace before the check.
	sleepCtx(ctx, 5*time.Second)

	bg := context.WithoutCancel(ctx)
	e := &Evidence{
		Tasks: w.infos(), Starts: map[string][]StartRecord{}, AgentRecords: map[string][]string{}, AgentRecordsErr: map[string]string{},
		Faults: in.windows(), AgentLostAfter: cfg.set.agentLostAfter, Slack: cfg.slack, End: time.Now(),
	}
	e.LiveProcesses = liveTaskProcesses(runID)
	for _, a := range c.agents {
		uids, err := c.agentRecords(bg, a)
		if err != nil {
			e.AgentRecordsErr[a.Node] = err.Error()
			continue
		}
		e.AgentRecords[a.Node] = uids
	}
	if err := retry(drainCtxOr(bg, time.Minute), func() error {
		var err error
		e.Existing, err = existingTasks(bg, k8s, namespace)
		return err
	}); err != nil {
		return nil, fmt.Errorf("listing the tasks at the end: %w", err)
	}
	stopWatch()
	e.Events, e.WatchGaps = rec.snapshot()
	if err := readCommandStarts(startsDir, e.Starts); err != nil {
		return nil, fmt.Errorf("reading the commands' start records: %w", err)
	}
	for _, a := range c.agents {
		if err := readAgentStarts(a.Process.LogPath(), a.Node, e.Starts); err != nil {
			return nil, fmt.Errorf("reading the start records in %s: %w", a.Process.LogPath(), err)
		}
	}
	e.Objects = readObjects(bg, c, e.Events)
	e.Beacon = bc.close()
	e.Workspaces = ws.observations()
	e.Snapshots = snapshotGens(bg, c, e.Workspaces)
	return e, nil
}

func drainCtxOr(ctx context.Context, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	go func() { <-c.Done(); cancel() }()
	return c
}

// heldDeleted returns the deleted task UIDs some agent still holds; an
// agent that does not answer holds none as far as the drain is concerned.
func heldDeleted(ctx context.Context, c *cluster, deleted []string) []string {
	if len(deleted) == 0 {
		return nil
	}
	want := map[string]bool{}
	for _, u := range deleted {
		want[u] = true
	}
	var out []string
	for _, a := range c.agents {
		uids, err := c.agentRecords(ctx, a)
		if err != nil {
			continue
		}
		for _, u := range uids {
			if want[u] {
				out = append(out, u)
			}
		}
	}
	return out
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], "...")
	}
	return s
}

// report prints the run's figures and the invariant table.
func report(out *os.File, cfg config, e *Evidence, results []Result) {
	fmt.Fprintf(out, "\nchaos: seed %d, %s of faults and workload, %d tasks\n", cfg.seed, cfg.duration, len(e.Tasks))

	// Outcomes by kind.
	counts := map[string]map[string]int{}
	for _, t := range e.Tasks {
		r := "<none>"
		if st := finalStatus(e, t.UID); st != nil && st.Reason != nil {
			r = string(*st.Reason)
		}
		if t.Deleted {
			r += " (deleted)"
		}
		if counts[t.Kind] == nil {
			counts[t.Kind] = map[string]int{}
		}
		counts[t.Kind][r]++
	}
	fmt.Fprintln(out, "\nOutcomes by kind:")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, k := range sortedKeys(counts) {
		var parts []string
		for _, r := range sortedKeys(counts[k]) {
			parts = append(parts, fmt.Sprintf("%s %d", r, counts[k][r]))
		}
		fmt.Fprintf(tw, "  %s\t%s\n", k, strings.Join(parts, ", "))
	}
	_ = tw.Flush()

	// Faults by kind.
	type agg struct {
		n     int
		total time.Duration
	}
	byKind := map[string]*agg{}
	for _, f := range e.Faults {
		if byKind[f.Kind] == nil {
			byKind[f.Kind] = &agg{}
		}
		byKind[f.Kind].n++
		byKind[f.Kind].total += f.End.Sub(f.Start)
	}
	fmt.Fprintln(out, "\nFaults injected:")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  kind\tcount\ttime until served again\n")
	for _, k := range sortedKeys(byKind) {
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", k, byKind[k].n, byKind[k].total.Round(100*time.Millisecond))
	}
	_ = tw.Flush()

	// The slowest short task: the worst end-to-end delay a fault caused
	// to a command that takes milliseconds.
	var worst time.Duration
	worstName := ""
	for _, t := range e.Tasks {
		if t.Kind != kindShort {
			continue
		}
		obs := e.Events[t.UID]
		if i := firstTerminal(obs); i >= 0 {
			if d := obs[i].At.Sub(t.Created); d > worst {
				worst, worstName = d, t.Name
			}
		}
	}
	if worstName != "" {
		fmt.Fprintf(out, "\nSlowest short task, creation to terminal status: %s (%s)\n", worst.Round(100*time.Millisecond), worstName)
	}

	fmt.Fprintln(out, "\nInvariants:")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  \tinvariant\tchecked\tviolations\tresult\tnote\n")
	for _, r := range results {
		res := "ok"
		if len(r.Violations) > 0 {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.Name, r.Checked, len(r.Violations), res, r.Note)
	}
	_ = tw.Flush()
	for _, r := range results {
		if len(r.Violations) == 0 {
			continue
		}
		vs := append([]Violation(nil), r.Violations...)
		sort.SliceStable(vs, func(i, j int) bool { return vs[i].Task < vs[j].Task })
		fmt.Fprintf(out, "\nViolations of %s (%s):\n", r.ID, r.Name)
		for _, v := range vs {
			fmt.Fprintf(out, "  %s/%s uid %s: %s\n", namespace, v.Task, ptr.Deref(nonEmpty(v.UID), "-"), v.Evidence)
		}
	}
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
