package system

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
)

// ScalePhase is the scale phase of hack/bench (`make bench-scale`,
// docs/scaling.md): for each point (agents, tasks) it starts a cluster of
// its own on this machine, one control plane, the controller process and
// the agents, creates the point's tasks at a steady rate and prints one
// row of figures per point: end-to-end tasks/s, create→terminal p50 and
// p99, controller CPU and API writes per task, controller RSS, the API
// server's and etcd's CPU per task, etcd's database size, a restarted
// controller's start to its first dispatch, and a lost node's workspaces
// until they are NodeLost. Points of real agents run bashtask-agent
// processes at the process level on loopback addresses; points of
// simulated agents run internal/rig/simagent servers in this process,
// which speak the agent protocol over mTLS and hold the workspaces.
//
// It lives beside the system phase because it measures with the same
// client, request counters and CPU readings.
type ScalePhase struct{ o scaleOptions }

type scaleOptions struct {
	points         string
	large          bool
	rate           float64
	longEvery      int
	longSeconds    float64
	workspaces     int
	wsEvery        int
	restartTasks   int
	agentLostAfter time.Duration
	shortDelay     time.Duration
	capacity       int
	workers        int
	wsTimeout      time.Duration
	stall          time.Duration
	profileDir     string
	profileFor     time.Duration
	keep           bool
}

// Name is "scale".
func (*ScalePhase) Name() string { return "scale" }

// Flags registers the scale phase's flags.
func (p *ScalePhase) Flags(fs *flag.FlagSet) {
	o := &p.o
	fs.StringVar(&o.points, "points", defaultScalePoints,
		"points to run, comma-separated AGENTS[sim]:TASKS (sim: simulated agents), e.g. -scale.points=100sim:1000 for one point")
	fs.BoolVar(&o.large, "large", false, "add the point "+largeScalePoint+" after -points: about half an hour more on a 2-core machine (docs/scaling.md)")
	fs.Float64Var(&o.rate, "rate", 100, "tasks created per second, steadily, at every point")
	fs.IntVar(&o.longEvery, "long-every", 10, "every Nth task is long (`sleep -long-seconds`), the others `true` (0: none)")
	fs.Float64Var(&o.longSeconds, "long-seconds", 2, "run time of a long task, in seconds")
	fs.IntVar(&o.workspaces, "workspaces", 10000, "BashWorkspaces made before the tasks at a point of simulated agents (real agents at the process level hold none)")
	fs.IntVar(&o.wsEvery, "workspace-every", 10, "at a point with workspaces, every Nth task runs in one of them, round robin (0: none)")
	fs.IntVar(&o.restartTasks, "restart-tasks", 200, "tasks created while the controller is down at the end of each point, for the new leader's first dispatch")
	fs.DurationVar(&o.agentLostAfter, "agent-lost-after", 15*time.Second, "the controllers' --agent-lost-after: the node-loss figure is this plus the controller's reaction")
	fs.DurationVar(&o.shortDelay, "sim-short-delay", 10*time.Millisecond, "run time of a short task on a simulated agent")
	fs.IntVar(&o.capacity, "capacity", 16, "concurrent tasks per agent (the agents' --max-concurrent-tasks, the simulated agents' capacity)")
	fs.IntVar(&o.workers, "workers", 16, "client workers creating workspaces")
	fs.DurationVar(&o.wsTimeout, "workspace-timeout", 10*time.Minute, "limit for the workspaces of a point to become Ready")
	fs.DurationVar(&o.stall, "stall-timeout", 3*time.Minute, "fail a point when none of its missing tasks became terminal for this long")
	fs.StringVar(&o.profileDir, "profile-dir", "", "take CPU profiles of kube-apiserver and the controller mid-way through each point's tasks into <dir>/<point>, and from the restarted controller's start into <dir>/<point>/restart (empty: none)")
	fs.DurationVar(&o.profileFor, "profile-duration", 10*time.Second, "length of the CPU profiles of -profile-dir")
	fs.BoolVar(&o.keep, "keep", false, "keep each point's cluster directory (logs) after a successful point")
}

// defaultScalePoints are the points of `make bench-scale`, chosen to fit
// in 40 minutes on a 2-core machine (docs/scaling.md); largeScalePoint is
// the 100,000-task point that -large adds.
const (
	defaultScalePoints = "2:1000,10:10000,100sim:10000"
	largeScalePoint    = "100sim:100000"
)

// scalePoint is one point of the curve.
type scalePoint struct {
	agents    int
	simulated bool
	tasks     int
}

func (p scalePoint) String() string {
	kind := "real"
	if p.simulated {
		kind = "sim"
	}
	return fmt.Sprintf("%d%s-%s", p.agents, kind, shortCount(p.tasks))
}

func shortCount(n int) string {
	switch {
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	default:
		return strconv.Itoa(n)
	}
}

// parsePoints parses -points.
func parsePoints(s string) ([]scalePoint, error) {
	var out []scalePoint
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		a, t, ok := strings.Cut(item, ":")
		p := scalePoint{}
		a, p.simulated = strings.CutSuffix(a, "sim")
		var err1, err2 error
		p.agents, err1 = strconv.Atoi(a)
		p.tasks, err2 = strconv.Atoi(t)
		if !ok || err1 != nil || err2 != nil || p.agents < 1 || p.agents > 250 || p.tasks < 1 {
			return nil, fmt.Errorf("-scale.points: %q is not AGENTS[sim]:TASKS with 1 to 250 agents and at least 1 task", item)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-scale.points: no point given")
	}
	return out, nil
}

// Run runs every point in order and prints the table.
func (p *ScalePhase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	o := p.o
	if o.large {
		o.points += "," + largeScalePoint
	}
	points, err := parsePoints(o.points)
	if err != nil {
		return nil, err
	}
	if o.rate <= 0 {
		return nil, fmt.Errorf("-scale.rate must be above 0, got %g", o.rate)
	}
	fmt.Printf("machine: %d CPUs, load average %s; points %s at %.0f creates/s\n", runtime.NumCPU(), phase.LoadAvg(), o.points, o.rate)
	var rows []scaleRow
	var runErr error
	for _, pt := range points {
		fmt.Printf("\n== point %s: %d %s agents, %d tasks\n", pt, pt.agents, map[bool]string{true: "simulated", false: "real"}[pt.simulated], pt.tasks)
		r, err := runPoint(ctx, o, env.ClusterOptions, pt)
		rows = append(rows, r)
		if err != nil {
			runErr = fmt.Errorf("point %s: %w", pt, err)
			break
		}
	}
	printScaleTable(rows)
	return scaleFigures(rows), runErr
}

// scaleRow is one point's figures; NaN is a figure not measured.
type scaleRow struct {
	point                          scalePoint
	workspaces                     int
	tps, p50, p99                  float64
	ctrlCPUms, writes, rssMiB      float64
	apiCPUms, etcdCPUms, etcdDBMiB float64
	leaderDispatchS, nodeLostS     float64
	wsReadyS                       float64
}

func newRow(pt scalePoint) scaleRow {
	n := math.NaN()
	return scaleRow{point: pt, tps: n, p50: n, p99: n, ctrlCPUms: n, writes: n, rssMiB: n, apiCPUms: n, etcdCPUms: n,
		etcdDBMiB: n, leaderDispatchS: n, nodeLostS: n, wsReadyS: n}
}

// pointDir is a fresh directory for a point's cluster.
func pointDir(pt scalePoint) (tmp, dir string, err error) {
	tmp, err = os.MkdirTemp("", "bashtask-scale-"+pt.String()+"-")
	return tmp, filepath.Join(tmp, "cluster"), err
}
