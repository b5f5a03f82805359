// Package apiserver is the apiserver phase of hack/bench (formerly
// hack/bench-apiserver). It measures kube-apiserver's CPU per BashTask for
// variants of the CRD's validation rules and of the writes a task costs, to
// tell where the API server's time per task goes before changing the API.
//
// It starts one control plane (etcd and kube-apiserver from -assets-dir,
// the CRD of -crd, no admission policies: they act on creates only and cost
// every variant the same) and runs windows of -tasks tasks, the variants in
// turn, -windows rounds, so that the machine's load lands on every variant.
// A task is what the controller makes of a short task: a create, then a
// write-ahead and a terminal status written through the status subresource,
// each conditional on the version the previous write returned and, like
// the controller's, without managedFields. One watch follows the namespace,
// as the controller's informer does. Each window's figure is the API
// server's CPU time (/proc/<pid>/stat, user plus system) during the window
// divided by its tasks; the tasks are deleted after each window so that the
// live objects do not grow from one window to the next.
//
// A variant is CRD[/WRITES]. CRD is one of:
//
//	base       the CRD of -crd as it is
//	nocel      every x-kubernetes-validations rule removed
//	nooldself  the rules that use oldSelf (immutability) removed
//	alt        the CRD of -alt-crd
//
// WRITES is empty (as above) or one of:
//
//	mf          status writes that send the managedFields back
//	nocond      statuses without conditions
//	createonly  the create alone
//
// The variants that remove rules or conditions are not candidate changes:
// they bound what the removed part costs.
//
// The phase starts a control plane of its own rather than using the
// shared local cluster: it swaps the CRD under the API server between
// windows, and measures an API server that only this phase loads (no
// controller, no agents, no admission policies).
//
// Its figures are apiserver.<variant>.cpu_ms_per_task, the median of the
// variant's windows.
package apiserver

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

// namespace holds every task of a run.
const namespace = "bench"

type options struct {
	assetsDir, crd, altCRD string
	variants               []string
	tasks, windows         int
	workers                int
	settle                 time.Duration
}

// Phase is the apiserver phase.
type Phase struct {
	o        options
	variants string
}

// Name is "apiserver".
func (*Phase) Name() string { return "apiserver" }

// Flags registers the flags of the former hack/bench-apiserver.
func (p *Phase) Flags(fs *flag.FlagSet) {
	o := &p.o
	fs.StringVar(&o.assetsDir, "assets-dir", cmp.Or(os.Getenv("KUBEBUILDER_ASSETS"), filepath.Join("bin", "k8s")), "directory of kube-apiserver and etcd")
	fs.StringVar(&o.crd, "crd", filepath.Join("config", "crd", "bases", "bashtask.dev_bashtasks.yaml"), "the BashTask CRD")
	fs.StringVar(&o.altCRD, "alt-crd", "", "a second BashTask CRD, the variant alt")
	fs.StringVar(&p.variants, "variants", "base,nocel,nooldself", "comma-separated variants, CRD[/WRITES] (see the package documentation)")
	fs.IntVar(&o.tasks, "tasks", 300, "tasks per window")
	fs.IntVar(&o.windows, "windows", 6, "windows per variant")
	fs.IntVar(&o.workers, "workers", 16, "client workers")
	fs.DurationVar(&o.settle, "settle", 5*time.Second, "wait after the CRD changed, until the API server serves the new one")
}

// Run measures and prints the variants' table.
func (p *Phase) Run(ctx context.Context, _ *phase.Env) (phase.Figures, error) {
	o := p.o
	o.variants = strings.Split(p.variants, ",")
	f := phase.Figures{}
	err := run(ctx, o, f)
	return f, err
}

func run(ctx context.Context, o options, f phase.Figures) (err error) {
	for _, v := range o.variants {
		crd, writes, _ := strings.Cut(v, "/")
		if !slices.Contains([]string{"base", "nocel", "nooldself", "alt"}, crd) || !slices.Contains([]string{"", "mf", "nocond", "createonly"}, writes) {
			return fmt.Errorf("-variants: unknown variant %q (CRD base, nocel, nooldself or alt; WRITES mf, nocond or createonly)", v)
		}
		if crd == "alt" && o.altCRD == "" {
			return fmt.Errorf("-variants: %q needs -alt-crd", v)
		}
	}
	if o.tasks < 1 || o.windows < 1 || o.workers < 1 {
		return fmt.Errorf("-tasks, -windows and -workers must be at least 1, got %d, %d and %d", o.tasks, o.windows, o.workers)
	}
	base, err := readCRD(o.crd)
	if err != nil {
		return err
	}
	var alt *apiextv1.CustomResourceDefinition
	if o.altCRD != "" {
		if alt, err = readCRD(o.altCRD); err != nil {
			return err
		}
	}

	others := phase.ControlPlaneChildren()
	cp, err := localcluster.StartControlPlane(ctx, o.assetsDir, filepath.Dir(o.crd), "")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Stop()) }()
	if err := apiextv1.AddToScheme(cp.Scheme); err != nil {
		return err
	}
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.NewWithWatch(&cfg, client.Options{Scheme: cp.Scheme})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	apiserver := apiserverPID(others)
	if apiserver == 0 {
		return errors.New("no kube-apiserver child process found")
	}
	w, err := c.Watch(ctx, &v1.BashTaskList{}, client.InNamespace(namespace))
	if err != nil {
		return fmt.Errorf("watching BashTasks: %w", err)
	}
	defer w.Stop()
	go func() {
		for range w.ResultChan() {
		}
	}()

	results := map[string][]float64{}
	current := ""
	for round := range o.windows {
		for vi, v := range o.variants {
			crd, writes, _ := strings.Cut(v, "/")
			if crd != current {
				want := base.DeepCopy()
				if crd == "alt" {
					want = alt.DeepCopy()
				}
				schema := want.Spec.Versions[0].Schema.OpenAPIV3Schema
				switch crd {
				case "nocel":
					dropRules(schema, func(apiextv1.ValidationRule) bool { return true })
				case "nooldself":
					dropRules(schema, func(r apiextv1.ValidationRule) bool { return strings.Contains(r.Rule, "oldSelf") })
				}
				if err := replaceVersions(ctx, c, want); err != nil {
					return err
				}
				current = crd
				time.Sleep(o.settle)
			}
			before, ok := cpuTime(apiserver)
			if !ok {
				return errors.New("kube-apiserver exited")
			}
			start := time.Now()
			if err := window(ctx, c, o, fmt.Sprintf("w%d-%d-", round, vi), writes); err != nil {
				return fmt.Errorf("variant %s: %w", v, err)
			}
			elapsed := time.Since(start)
			after, _ := cpuTime(apiserver)
			ms := float64((after - before).Microseconds()) / 1000 / float64(o.tasks)
			results[v] = append(results[v], ms)
			fmt.Printf("round %d  %-20s %6.2f ms of kube-apiserver CPU per task, %6.1f tasks/s\n", round+1, v, ms, float64(o.tasks)/elapsed.Seconds())
			if err := c.DeleteAllOf(ctx, &v1.BashTask{}, client.InNamespace(namespace)); err != nil {
				return fmt.Errorf("deleting the window's tasks: %w", err)
			}
		}
	}
	fmt.Println("\nvariant               median   against the first   windows")
	first := stats.Median(results[o.variants[0]])
	for _, v := range o.variants {
		m := stats.Median(results[v])
		parts := make([]string, len(results[v]))
		for i, x := range results[v] {
			parts[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Printf("%-20s %7.2f   %+6.1f %%           %s\n", v, m, 100*(m/first-1), strings.Join(parts, " "))
		f["apiserver."+v+".cpu_ms_per_task"] = m
	}
	return nil
}

// window creates o.tasks tasks named prefix00000, ... from o.workers
// workers and writes their statuses as writes says.
func window(ctx context.Context, c client.Client, o options, prefix, writes string) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, o.workers)
	for range o.workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= o.tasks {
					return
				}
				if err := task(ctx, c, fmt.Sprintf("%s%05d", prefix, i), writes); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return errors.Join(<-errs, ctx.Err())
}

// task creates one task and writes its statuses.
func task(ctx context.Context, c client.Client, name, writes string) error {
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
	if err := c.Create(ctx, bt); err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	if writes == "createonly" {
		return nil
	}
	for _, st := range statuses(bt.Generation) {
		if writes == "nocond" {
			st.Conditions = nil
		}
		if writes != "mf" {
			bt.ManagedFields = nil
		}
		bt.Status = st
		if err := c.Status().Update(ctx, bt); err != nil {
			return fmt.Errorf("writing the status of %s: %w", name, err)
		}
	}
	return nil
}

// statuses are the write-ahead and the terminal status the controller
// writes for a `true` task, as a watch sees them.
func statuses(gen int64) []v1.BashTaskStatus {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	zero := int32(0)
	agent := &v1.AgentRef{Pod: ptr.To("bashtask-agent-node-1"), Incarnation: ptr.To("956a8c25f2ee5b6c")}
	cond := func(typ string, s metav1.ConditionStatus, reason, message string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: message, LastTransitionTime: now, ObservedGeneration: gen}
	}
	scheduled := cond(v1.ConditionScheduled, metav1.ConditionTrue, "Dispatched", "dispatched to the agent on node node-1")
	waiting := "waiting for the agent on node node-1 to start the command"
	ahead := v1.BashTaskStatus{ObservedGeneration: &gen, Phase: ptr.To(v1.PhasePending), NodeName: ptr.To("node-1"), Agent: agent,
		Conditions: []metav1.Condition{scheduled,
			cond(v1.ConditionReconciling, metav1.ConditionTrue, "Pending", waiting),
			cond(v1.ConditionReady, metav1.ConditionFalse, "Pending", waiting)}}
	empty := func() *v1.StreamStatus {
		return &v1.StreamStatus{TotalBytes: ptr.To[int64](0), SHA256: ptr.To("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")}
	}
	exited := "shell exited with status 0"
	done := v1.BashTaskStatus{ObservedGeneration: &gen,
		Phase: ptr.To(v1.PhaseSucceeded), Reason: ptr.To(v1.ReasonSucceeded), Message: ptr.To(exited),
		ExitCode: &zero, NodeName: ptr.To("node-1"), Agent: agent,
		Isolation: &v1.IsolationStatus{Mechanism: ptr.To(v1.IsolationCgroup), Level: ptr.To(v1.IsolationLevelProcess), Network: ptr.To(v1.NetworkNode)},
		StartTime: &now, CompletionTime: &now, Stdout: empty(), Stderr: empty(), LeftoverProcesses: &zero,
		Conditions: []metav1.Condition{scheduled,
			cond(v1.ConditionReady, metav1.ConditionTrue, "Succeeded", exited),
			cond(v1.ConditionComplete, metav1.ConditionTrue, "Succeeded", exited),
			cond(v1.ConditionOutputUploaded, metav1.ConditionTrue, "NotNeeded", "the tails in status hold the whole output")}}
	return []v1.BashTaskStatus{ahead, done}
}

func readCRD(path string) (*apiextv1.CustomResourceDefinition, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		return nil, fmt.Errorf("%s: want one version with a schema, got %d versions", path, len(crd.Spec.Versions))
	}
	return &crd, nil
}

// replaceVersions puts want's versions (their schemas) into the served CRD.
func replaceVersions(ctx context.Context, c client.Client, want *apiextv1.CustomResourceDefinition) error {
	var live apiextv1.CustomResourceDefinition
	if err := c.Get(ctx, types.NamespacedName{Name: want.Name}, &live); err != nil {
		return fmt.Errorf("reading the CRD: %w", err)
	}
	live.Spec.Versions = want.Spec.Versions
	if err := c.Update(ctx, &live); err != nil {
		return fmt.Errorf("updating the CRD: %w", err)
	}
	return nil
}

// dropRules removes the x-kubernetes-validations rules drop selects from s
// and every schema under it.
func dropRules(s *apiextv1.JSONSchemaProps, drop func(apiextv1.ValidationRule) bool) {
	if s == nil {
		return
	}
	s.XValidations = slices.DeleteFunc(s.XValidations, drop)
	for k, p := range s.Properties {
		dropRules(&p, drop)
		s.Properties[k] = p
	}
	if s.Items != nil {
		dropRules(s.Items.Schema, drop)
	}
	if s.AdditionalProperties != nil {
		dropRules(s.AdditionalProperties.Schema, drop)
	}
}

// apiserverPID returns the pid of the kube-apiserver child of this
// process that is not one of others (the shared cluster's, when it runs),
// 0 when there is none.
func apiserverPID(others []int) int {
	for _, pid := range procfs.PIDs() {
		st, err := procfs.ReadStat(pid)
		if err != nil || st.PPID != os.Getpid() || slices.Contains(others, pid) {
			continue
		}
		if comm, _ := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "comm")); strings.TrimSpace(string(comm)) == "kube-apiserver" {
			return pid
		}
	}
	return 0
}

// cpuTime is the user plus system time of pid.
func cpuTime(pid int) (time.Duration, bool) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0, false
	}
	return time.Duration(st.UTime+st.STime) * (time.Second / procfs.ClockTicks), true
}
