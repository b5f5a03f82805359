// Command bench is the one benchmark harness of bashtask: it runs phases,
// each a former hack/bench-* program, prints each phase's table as that
// program did, and writes one JSON file with a section per phase
// (report.Document).
//
// The phases, in the order they run whatever the order of -phases:
//
//	executor   the executor against plain process creation and a plain write (phase/executor)
//	snapshot   a workspace snapshot and restore against tar | zstd (phase/snapshot)
//	images     the node's image store against crane export | tar -x, as root (phase/images)
//	workspace  what 1000 idle workspaces cost one agent, as root (phase/workspace)
//	egress     a connection's setup with and without a workspace's egress policy, and an HTTPS download direct and through the intercepting proxy, as root (phase/egress)
//	apiserver  kube-apiserver CPU per task for CRD and status variants (phase/apiserver)
//	resume     a Suspended workspace's resume, as root, on a cluster of its own (phase/resume)
//	fork       a workspace's fork on its node against cp -a, as root, on the shared cluster (phase/fork)
//	output     the output API on the shared cluster (phase/output)
//	session    one command of a session through the plugin and the Go client, on the shared cluster (phase/session)
//	terminal   keystroke echo through bashtasks/attach, on the shared cluster (phase/terminal)
//	portforward  1 GiB and small HTTP requests through the client's PortForward into a workspace, on the shared cluster (phase/portforward)
//	kubectl    the terminal and port-forward against kubectl exec -it and port-forward to a pod, on the one-node cluster of make cluster-up (phase/kubectl)
//	mcp        one command through kubectl bashtask mcp over stdio against the plugin, on the shared cluster (phase/mcp)
//	system     the whole system on the shared cluster; its table takes in
//	           the executor's, the output's and the resume's figures (phase/system)
//	scale      2, 10 and 100 agents (real and simulated), 1k to 100k tasks, on
//	           clusters of its own (phase/system, docs/scaling.md)
//
// -phases picks them; the default is what `make bench` runs: executor,
// egress, resume and fork (as root only), output, snapshot, session,
// terminal, mcp and system.
//
// The local cluster of the output, session, terminal, mcp and system phases is started once, when
// the first of them needs it, through internal/rig/localcluster in this
// process, and stopped after the last of them (and on error or Ctrl-C).
// Its flags are this program's: -bin-dir, -assets-dir, -crd-dir,
// -admission-dir, -agents, -isolation, -controller-arg, -agent-arg, -keep.
//
// Every flag of a phase is -<phase>.<flag> (e.g. -executor.n=20,
// -output.bytes=0); -<phase>-args passes a phase's flags as one string in
// the former program's syntax (e.g. -output-args='-bytes=0 -lines=0', the
// BENCH_*_ARGS variables of the Makefile). The system phase's flags are
// also accepted without the prefix (-rss-tasks=0, -pairs=9), as
// hack/bench took them.
//
// A phase that fails ends the run; its table still shows what it measured,
// and the JSON file is then not written (an older one is removed, so that
// it is not taken for this run's).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/apiserver"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/egress"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/executor"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/fork"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/images"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/kubectl"
	mcpphase "github.com/bashtask/bashtask-operator/hack/bench/phase/mcp"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/output"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/portforward"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/resume"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/session"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/snapshot"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/system"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/terminal"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/workspace"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
)

// phases are every phase, in the order they run.
func phases() []phase.Phase {
	return []phase.Phase{&executor.Phase{}, &snapshot.Phase{}, &images.Phase{}, &workspace.Phase{}, &egress.Phase{}, &apiserver.Phase{},
		&resume.Phase{}, &fork.Phase{}, &output.Phase{}, &session.Phase{}, &terminal.Phase{}, &portforward.Phase{}, &kubectl.Phase{}, &mcpphase.Phase{}, &system.Phase{}, &system.ScalePhase{}}
}

// defaultPhases is what `make bench` runs; resume only as root.
func defaultPhases() string {
	if os.Geteuid() == 0 {
		return "executor,egress,output,snapshot,resume,fork,session,terminal,mcp,system"
	}
	return "executor,output,snapshot,session,terminal,mcp,system"
}

func main() {
	// This binary is also the task shim of the tenant level (the executor
	// phase's -shim=self, the workspace phase), and the child the
	// executor and workspace phases re-execute.
	shim.Main()
	executor.ChildMain()
	workspace.ChildMain()
	// The cluster's control plane is started from this goroutine, locked
	// to the main thread, so that a child's parent-death signal fires only
	// when this process ends, not when some other thread of the runtime
	// does.
	runtime.LockOSThread()
	// envtest and controller-runtime's client log through it; their
	// progress is not part of the output.
	ctrllog.SetLogger(logr.Discard())

	all := phases()
	var (
		chosen  = flag.String("phases", defaultPhases(), "comma-separated phases to run: "+names(all))
		jsonOut = flag.String("json", "", "write every phase's figures to this JSON file, a section per phase (empty: none)")
		co      phase.ClusterOptions
	)
	flag.StringVar(&co.BinDir, "bin-dir", "bin", "directory of bashtask-controller and bashtask-agent (the shared cluster)")
	flag.StringVar(&co.AssetsDir, "assets-dir", cmp.Or(os.Getenv("KUBEBUILDER_ASSETS"), filepath.Join("bin", "k8s")), "directory of kube-apiserver and etcd (the shared cluster, the system phase's raw API control plane)")
	flag.StringVar(&co.CRDDir, "crd-dir", filepath.Join("config", "crd", "bases"), "CRD manifests (the shared cluster)")
	flag.StringVar(&co.AdmissionDir, "admission-dir", filepath.Join("config", "admission"), "admission policies (the shared cluster)")
	flag.IntVar(&co.Agents, "agents", 2, "agents of the shared cluster")
	flag.StringVar(&co.Isolation, "isolation", "", "isolation level of the shared cluster's agents, process or tenant (empty: tenant as root, process otherwise)")
	flag.Func("controller-arg", "extra flag for the shared cluster's bashtask-controller (repeatable), e.g. -controller-arg=--workers=16", func(s string) error {
		co.ControllerArgs = append(co.ControllerArgs, s)
		return nil
	})
	flag.Func("agent-arg", "extra flag for the shared cluster's bashtask-agents (repeatable)", func(s string) error {
		co.AgentArgs = append(co.AgentArgs, s)
		return nil
	})
	flag.BoolVar(&co.Keep, "keep", false, "keep the shared cluster's directory (logs, agent state) after a successful run")

	sets := map[string]*flag.FlagSet{}
	argStrings := map[string]*string{}
	for _, p := range all {
		fs := flag.NewFlagSet(p.Name(), flag.ContinueOnError)
		p.Flags(fs)
		sets[p.Name()] = fs
		fs.VisitAll(func(f *flag.Flag) {
			flag.Var(f.Value, p.Name()+"."+f.Name, f.Usage)
			if p.Name() == "system" {
				flag.Var(f.Value, f.Name, f.Usage+" (-system."+f.Name+")")
			}
		})
		argStrings[p.Name()] = flag.String(p.Name()+"-args", "", "flags of the "+p.Name()+" phase, in one string, without the prefix (e.g. \"-a=1 -b 2\")")
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fail(2, fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	for _, p := range all {
		if s := *argStrings[p.Name()]; s != "" {
			if err := sets[p.Name()].Parse(strings.Fields(s)); err != nil {
				fail(2, fmt.Errorf("-%s-args: %w", p.Name(), err))
			}
		}
	}
	run, err := pick(all, *chosen)
	if err != nil {
		fail(2, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = runPhases(ctx, run, co, *jsonOut)
	stop()
	if err != nil {
		fail(1, err)
	}
}

// pick returns the phases named in list, in the order of all.
func pick(all []phase.Phase, list string) ([]phase.Phase, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.ContainsFunc(all, func(p phase.Phase) bool { return p.Name() == n }) {
			return nil, fmt.Errorf("-phases: unknown phase %q (phases: %s)", n, names(all))
		}
		want[n] = true
	}
	var out []phase.Phase
	for _, p := range all {
		if want[p.Name()] {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("-phases: no phase chosen")
	}
	return out, nil
}

// runPhases runs the phases in order, sharing one cluster, and writes the
// JSON file when every phase succeeded.
func runPhases(ctx context.Context, run []phase.Phase, co phase.ClusterOptions, jsonOut string) (err error) {
	env := &phase.Env{Results: map[string]phase.Figures{}, ClusterOptions: co}
	lastClusterUser := -1
	for i, p := range run {
		if u, ok := p.(phase.ClusterUser); ok {
			u.Configure(&env.ClusterOptions)
			lastClusterUser = i
		}
	}
	defer env.Close()
	doc := report.NewDocument()
	if jsonOut != "" {
		// An older file is not this run's.
		_ = os.Remove(jsonOut)
	}
	for i, p := range run {
		fmt.Printf("\n##### phase %s (%d of %d), load average %s\n", p.Name(), i+1, len(run), phase.LoadAvg())
		f, err := p.Run(ctx, env)
		if f != nil {
			env.Results[p.Name()] = f
			doc.Add(p.Name(), f)
		}
		if err != nil {
			env.Fail()
			return fmt.Errorf("phase %s: %w", p.Name(), err)
		}
		if i == lastClusterUser {
			env.Close()
		}
	}
	doc.Machine.LoadEnd = phase.LoadAvg()
	if jsonOut != "" {
		if err := doc.Write(jsonOut); err != nil {
			return err
		}
		fmt.Printf("figures written to %s\n", jsonOut)
	}
	return nil
}

func names(ps []phase.Phase) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name())
	}
	return strings.Join(out, ", ")
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(code)
}
