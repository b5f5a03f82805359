// Package mcp is the mcp phase of hack/bench: one command through
// `kubectl bashtask mcp`'s run tool over stdio, against the same command
// through `kubectl bashtask run`, on the shared local cluster of
// hack/bench (internal/rig/localcluster).
//
// It creates one BashWorkspace (owner "bench") and waits until it is
// Ready, starts the built binary `kubectl-bashtask mcp --owner bench`
// (-bin-dir) once, with KUBECONFIG set to the cluster's kubeconfig, and
// connects the Go SDK's client to it over stdio, as Claude Code or Codex
// start it. Then it runs `true` in the workspace -runs times each, one at
// a time and alternating, after -warmup untimed runs of each:
//
//   - the plugin: `kubectl-bashtask run -w W -- true` exec'd, the whole
//     process's wall time, as the session phase measures it;
//   - MCP: a tools/call of run with {workspace: W, command: "true"}, from
//     the request's send to its result.
//
// Target (docs/performance.md): MCP's p50 at most 10 ms over the plugin's.
package mcp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// targetOverMs is the phase's target: MCP's p50 over the plugin's, in
// milliseconds.
const targetOverMs = 10

// Names of the phase's objects.
const (
	namespace = "bench-mcp"
	workspace = "mcp"
	owner     = "bench"
)

type options struct {
	runs, warmup int
	timeout      time.Duration
}

// Phase is the mcp phase.
type Phase struct{ o options }

// Name is "mcp".
func (*Phase) Name() string { return "mcp" }

// Flags registers the phase's flags.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.o.runs, "runs", 50, "timed runs of the plugin and of MCP each, alternating")
	fs.IntVar(&p.o.warmup, "warmup", 3, "untimed runs of each before the timed ones")
	fs.DurationVar(&p.o.timeout, "timeout", time.Minute, "limit of one run, and of the workspace's wait for Ready")
}

// Configure implements phase.ClusterUser: the phase runs on the shared
// cluster and needs nothing of its configuration.
func (*Phase) Configure(*phase.ClusterOptions) {}

// Run measures the plugin's and MCP's runs on the shared cluster.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	c, err := env.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	plugin := filepath.Join(env.ClusterOptions.BinDir, "kubectl-bashtask")
	if _, err := os.Stat(plugin); err != nil {
		return nil, fmt.Errorf("the plugin binary: %w (make build)", err)
	}
	oc, err := setup(ctx, c.Kubeconfig, p.o.timeout)
	if err != nil {
		return nil, err
	}
	defer cleanup(oc, p.o.timeout)
	session, err := connect(ctx, plugin, c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	defer func() { _ = session.Close() }()
	var pl, mc []float64
	for i := range p.o.warmup + p.o.runs {
		d, err := pluginRun(ctx, plugin, c.Kubeconfig, p.o.timeout)
		if err != nil {
			return nil, fmt.Errorf("plugin run %d: %w", i, err)
		}
		m, err := mcpRun(ctx, session, p.o.timeout)
		if err != nil {
			return nil, fmt.Errorf("MCP run %d: %w", i, err)
		}
		if i >= p.o.warmup {
			pl, mc = append(pl, ms(d)), append(mc, ms(m))
		}
	}
	return printTable(p.o, pl, mc), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// setup creates the namespace and the workspace and waits until it is
// Ready.
func setup(ctx context.Context, kubeconfig string, timeout time.Duration) (*client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	k, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	oc, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := oc.CreateWorkspace(ctx, client.WorkspaceOptions{Namespace: namespace, Name: workspace, Owner: owner}); err != nil && !apierrors.IsAlreadyExists(errors.Unwrap(err)) {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ws, err := oc.WaitWorkspaceReady(wctx, namespace, workspace)
	if err != nil {
		return nil, err
	}
	fmt.Printf("workspace %s/%s is Ready on %s\n", namespace, workspace, ptr.Deref(ws.Status.NodeName, "?"))
	return oc, nil
}

// cleanup deletes the workspace, so that the phases after this one find
// the agents as they were.
func cleanup(oc *client.Client, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := oc.DeleteWorkspace(ctx, namespace, workspace); err != nil {
		fmt.Printf("deleting workspace %s: %v\n", workspace, err)
	}
}

// connect starts `kubectl-bashtask mcp` and connects to it over stdio.
func connect(ctx context.Context, plugin, kubeconfig string) (*sdk.ClientSession, error) {
	cmd := exec.Command(plugin, "-n", namespace, "mcp", "--owner", owner)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stderr = os.Stderr
	c := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "v0"}, nil)
	s, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to kubectl-bashtask mcp: %w", err)
	}
	return s, nil
}

// pluginRun execs `kubectl-bashtask run -w W -- true` once and returns its
// wall time.
func pluginRun(ctx context.Context, plugin, kubeconfig string, timeout time.Duration) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(rctx, plugin, "-n", namespace, "run", "-w", workspace, "--", "true")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, out.String())
	}
	return time.Since(start), nil
}

// mcpRun calls the run tool with `true` once and returns the time from
// the request to its result.
func mcpRun(ctx context.Context, s *sdk.ClientSession, timeout time.Duration) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res, err := s.CallTool(rctx, &sdk.CallToolParams{Name: "run", Arguments: map[string]any{"workspace": workspace, "command": "true"}})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if res.IsError {
		return 0, fmt.Errorf("tool error: %+v", res.Content)
	}
	if m, ok := res.StructuredContent.(map[string]any); !ok || m["exit_code"] != float64(0) {
		return 0, fmt.Errorf("result %+v, want exit code 0", res.StructuredContent)
	}
	return d, nil
}

// printTable prints the phase's table and returns its figures.
func printTable(o options, pl, mc []float64) phase.Figures {
	fmt.Printf("\n== one command through MCP and through the plugin: %d runs of each, one at a time, in workspace %s; load average %s\n", o.runs, workspace, phase.LoadAvg())
	tw := report.NewTable(os.Stdout, false)
	tw.Row("ms", "runs", "p50", "p90", "max", "target")
	row := func(what string, xs []float64, target string) {
		tw.Rowf("%s\t%d\t%.1f\t%.1f\t%.1f\t%s", what, len(xs), stats.Percentile(xs, 0.5), stats.Percentile(xs, 0.9), slices.Max(xs), target)
	}
	over := stats.Percentile(mc, 0.5) - stats.Percentile(pl, 0.5)
	verdict := "ok"
	if over > targetOverMs {
		verdict = "MISS"
	}
	row("kubectl-bashtask run -w W -- true, the process's wall time", pl, "")
	row("MCP tools/call run {command: true} over stdio, request to result", mc, fmt.Sprintf("p50 <= plugin's + %d: %+.1f %s", targetOverMs, over, verdict))
	_ = tw.Flush()
	f := phase.Figures{}
	for key, xs := range map[string][]float64{"mcp.plugin_run": pl, "mcp.mcp_run": mc} {
		f[key+"_p50_ms"] = stats.Percentile(xs, 0.5)
		f[key+"_p90_ms"] = stats.Percentile(xs, 0.9)
		f[key+"_max_ms"] = slices.Max(xs)
	}
	f["mcp.over_plugin_p50_ms"] = over
	f["mcp.runs"] = float64(o.runs)
	return f
}
