// Package phase is what the phases of hack/bench share: the interface each
// phase implements, the figures it returns, and the local cluster started
// lazily, once, for the phases that run on one.
package phase

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
)

// Figures are a phase's results by their JSON keys (e.g.
// "executor.overhead_ratio"); a figure not measured is left out or NaN.
type Figures map[string]float64

// Phase is one part of the benchmark, a former hack/bench-* program.
type Phase interface {
	// Name is the phase's name in -phases and in the JSON file.
	Name() string
	// Flags registers the phase's flags on fs under their names of the
	// former program (the harness also offers them as -<name>.<flag>).
	Flags(fs *flag.FlagSet)
	// Run measures and prints the phase's table. A failed phase returns
	// the figures it measured before it failed, if any, with its error.
	Run(ctx context.Context, env *Env) (Figures, error)
}

// ClusterUser is a phase that runs on the shared local cluster and needs
// something of its configuration; the harness calls Configure, for every
// phase chosen, before the cluster starts.
type ClusterUser interface {
	Configure(o *ClusterOptions)
}

// ClusterOptions configure the shared local cluster.
type ClusterOptions struct {
	// BinDir, AssetsDir, CRDDir and AdmissionDir are as in
	// localcluster.LauncherOptions.
	BinDir, AssetsDir, CRDDir, AdmissionDir string
	// Agents is the number of agents.
	Agents int
	// Isolation is the agents' level; empty is tenant as root, process
	// otherwise.
	Isolation string
	// ControllerArgs and AgentArgs are extra flags of the controller and
	// of every agent.
	ControllerArgs, AgentArgs []string
	// MaxConcurrentTasks, when above 0, is every agent's
	// --max-concurrent-tasks (the agent's default is 16).
	MaxConcurrentTasks int
	// Keep keeps the cluster's directory (logs, agent state) after a
	// successful run; it is always kept after a failure.
	Keep bool
}

// Env is what the harness gives each phase.
type Env struct {
	// Results holds the figures of the phases that ran before this one,
	// by phase name.
	Results map[string]Figures
	// ClusterOptions configure the shared cluster; they are read when the
	// first phase asks for it.
	ClusterOptions ClusterOptions

	cluster    *Cluster
	clusterErr error
	failed     bool
}

// Cluster is the shared local cluster, started through
// internal/rig/localcluster in this process.
type Cluster struct {
	*localcluster.Cluster
	// Dir is the cluster's directory: kubeconfig, logs/, pids/.
	Dir string
	// ControlPlanePIDs are the etcd and kube-apiserver processes of this
	// cluster (children of this process, as every control plane a phase
	// starts is: this list tells them apart).
	ControlPlanePIDs []int
	tmp              string
	// log is the launcher's log: restarts, exits and errors of the
	// components, printed when the cluster stops.
	log *syncbuf.Buffer
}

// Cluster returns the shared local cluster, starting it on the first call.
// A start that failed fails every later call the same way.
func (e *Env) Cluster(ctx context.Context) (*Cluster, error) {
	if e.cluster != nil || e.clusterErr != nil {
		return e.cluster, e.clusterErr
	}
	e.cluster, e.clusterErr = e.startCluster(ctx)
	return e.cluster, e.clusterErr
}

func (e *Env) startCluster(ctx context.Context) (*Cluster, error) {
	o := e.ClusterOptions
	tmp, err := os.MkdirTemp("", "bashtask-bench-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(tmp, "cluster")
	agentArgs := slices.Clone(o.AgentArgs)
	if o.MaxConcurrentTasks > 0 {
		agentArgs = append([]string{"--max-concurrent-tasks=" + strconv.Itoa(o.MaxConcurrentTasks)}, agentArgs...)
	}
	before := ControlPlaneChildren()
	log := &syncbuf.Buffer{}
	start := time.Now()
	fmt.Printf("starting the local cluster: %d agents, isolation %s, controller args %q, agent args %q, in %s\n",
		o.Agents, cmp.Or(o.Isolation, "(default)"), o.ControllerArgs, agentArgs, dir)
	lc, err := localcluster.Up(ctx, localcluster.LauncherOptions{
		Dir: dir, BinDir: o.BinDir, AssetsDir: o.AssetsDir, CRDDir: o.CRDDir, AdmissionDir: o.AdmissionDir,
		Agents: o.Agents, Isolation: o.Isolation, ControllerArgs: o.ControllerArgs, AgentArgs: agentArgs,
		Log: slog.New(slog.NewTextHandler(log, nil)),
	})
	if err != nil {
		localcluster.WriteLogTails(os.Stderr, dir, 15)
		fmt.Fprintf(os.Stderr, "bench: logs and state kept in %s\n", dir)
		return nil, fmt.Errorf("starting the local cluster: %w", err)
	}
	c := &Cluster{Cluster: lc, Dir: dir, tmp: tmp, log: log}
	for _, pid := range ControlPlaneChildren() {
		if !slices.Contains(before, pid) {
			c.ControlPlanePIDs = append(c.ControlPlanePIDs, pid)
		}
	}
	fmt.Printf("local cluster is up in %s with %d agents at isolation %s; objects go to %s\n",
		time.Since(start).Round(100*time.Millisecond), len(lc.Agents), lc.Isolation, lc.BucketURL)
	return c, nil
}

// Fail marks the run as failed, so that Close keeps the cluster's
// directory for its logs.
func (e *Env) Fail() { e.failed = true }

// Close stops the shared cluster if it was started, and removes its
// directory unless the run failed or ClusterOptions.Keep.
func (e *Env) Close() {
	c := e.cluster
	if c == nil {
		return
	}
	e.cluster = nil
	if e.failed {
		localcluster.WriteLogTails(os.Stderr, c.Dir, 15)
	}
	c.Down()
	// A figure measured while a component restarted measures something
	// else: the launcher's restarts, exits and errors are printed.
	for _, line := range strings.Split(c.log.String(), "\n") {
		if strings.Contains(line, "Restart") || strings.Contains(line, "Exited") || strings.Contains(line, "level=ERROR") ||
			strings.Contains(line, "killed") {
			fmt.Printf("launcher: %s\n", line)
		}
	}
	if e.failed || e.ClusterOptions.Keep {
		fmt.Fprintf(os.Stderr, "bench: logs and state kept in %s\n", c.Dir)
		return
	}
	_ = os.RemoveAll(c.tmp)
}

// ControlPlaneChildren returns the etcd and kube-apiserver processes whose
// parent is this process.
func ControlPlaneChildren() []int {
	self := os.Getpid()
	var out []int
	for _, pid := range procfs.PIDs() {
		st, err := procfs.ReadStat(pid)
		if err != nil || st.PPID != self {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if name := strings.TrimSpace(string(comm)); name == "etcd" || name == "kube-apiserver" {
			out = append(out, pid)
		}
	}
	return out
}

// LoadAvg is the 1, 5 and 15 minute load averages of /proc/loadavg, or
// "unknown".
func LoadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// NewClient returns a client for BashTasks, BashWorkspaces and Namespaces
// with cfg's QPS and burst. Its REST mapper is fixed: the lazy one reads
// discovery, which lags behind on a loaded machine and made creates fail
// mid-phase with "no matches for kind" although the kind was served.
func NewClient(cfg *rest.Config) (client.WithWatch, error) {
	scheme, err := localcluster.NewScheme()
	if err != nil {
		return nil, err
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(v1.GroupVersion.WithKind("BashTask"), meta.RESTScopeNamespace)
	mapper.Add(v1.GroupVersion.WithKind("BashWorkspace"), meta.RESTScopeNamespace)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: mapper})
}
