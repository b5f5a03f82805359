// Package operator wires the BashTask controller into a controller-runtime
// manager: the agent registry, the BashTask and BashWorkspace reconcilers,
// the orphan collector (which also sweeps stale workspace copies), the
// metrics, the health checks and the output.bashtask.dev API server. The
// bashtask-controller binary and the in-process test rig
// (internal/rig/testrig) both call Setup, so that what the tests run is
// what ships.
package operator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"gocloud.dev/blob"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/taskrecord"
	"github.com/bashtask/bashtask-operator/outputapi"
)

// RecorderName is the name events of the controller are reported under
// (their reportingController).
const RecorderName = "bashtask-controller"

// Channel capacities between the agent registry and its consumers. A
// full channel makes the registry's Watch loop wait, so they are sized
// for bursts: one task event per task of an agent that reconnects.
const (
	taskEventsCap   = 1024
	agentChangesCap = 64
	heldTasksCap    = 1024
)

// Options is everything Setup needs besides the manager.
type Options struct {
	// AgentNamespace and AgentService name the agents' headless Service,
	// whose EndpointSlices (label kubernetes.io/service-name) list the
	// agents. Both are required.
	AgentNamespace, AgentService string
	// AgentPortName is the name of the agents' gRPC port in the
	// EndpointSlices; empty takes the first port.
	AgentPortName string
	// AgentTLS is the mTLS client configuration (client certificate, CA,
	// the agents' server name) every agent is dialled with, by the
	// registry and by the output API's readers. Required: there is no
	// plaintext mode.
	AgentTLS *tls.Config
	// Clock is the monotonic clock of agent unreachability and of the
	// reconcilers' timings; nil means the real clock.
	Clock clock.PassiveClock
	// Controller are the reconcilers' tunables (controllers.Options,
	// normally from controllers.DefaultOptions). Its Fence gives way to
	// Fence below when that is set, so that the registry and the
	// reconcilers always share one. Its AgentLostAfter also sets the
	// workspace lease the registry grants the agents: half of it.
	Controller controllers.Options
	// Workers is the number of BashTasks, and separately of
	// BashWorkspaces, reconciled concurrently; zero or less means 1.
	Workers int
	// Fence, when set (leader election on), is asked before every agent
	// call and status write; nil (no leader election) takes
	// Controller.Fence, normally nil too. When the fence also has a
	// Collector() prometheus.Collector method (agentpool.LeaderFence), that
	// collector is registered with Metrics.
	Fence agentpool.Fencer
	// Metrics, when set, receives the controller's collectors (the task
	// and agent metrics, the Watch stream ends, the workspace phases and
	// the fence's refusals); normally controller-runtime's
	// metrics.Registry. Nil registers nothing.
	Metrics prometheus.Registerer
	// OutputAPI configures the output.bashtask.dev server; its zero value
	// (Port 0) serves none.
	OutputAPI OutputAPIOptions
}

// OutputAPIOptions configure the output.bashtask.dev aggregated API
// server, which every replica serves (not only the leader).
type OutputAPIOptions struct {
	// Port is the HTTPS port; 0 serves no output API.
	Port int
	// BindAddress is the address to listen on; nil means all addresses.
	BindAddress net.IP
	// CertDir holds the serving certificate, tls.crt and tls.key; a
	// self-signed pair is generated there when they are missing.
	CertDir string
	// Kubeconfig reaches kube-apiserver for delegated authentication and
	// authorization; empty means the in-cluster configuration.
	Kubeconfig string
	// BucketURL is the gocloud.dev blob URL of the bucket the agents
	// upload output to, read with the controller's own credentials for
	// output an agent no longer holds; empty asks the task's node's agent
	// to read it from its own bucket. The URL's scheme must have a
	// driver linked into the binary.
	BucketURL string
}

// Operator is the controller as Setup added it to a manager. Its parts
// run once the manager starts.
type Operator struct {
	// Registry holds the connections and Watch streams to the agents.
	Registry *agentpool.AgentRegistry
	// Tasks is the BashTask reconciler.
	Tasks *controllers.BashTaskReconciler
	// Workspaces is the BashWorkspace reconciler.
	Workspaces *controllers.BashWorkspaceReconciler
	// Orphans stops tasks whose BashTask is gone and removes stale
	// workspace copies.
	Orphans *controllers.OrphanCollector
	// Metrics are the task and agent metrics, registered with
	// Options.Metrics when that was set.
	Metrics *controllers.Metrics
	// OutputAPI is the output.bashtask.dev server; nil when
	// Options.OutputAPI.Port is 0.
	OutputAPI *outputapi.Server

	// readers are the output API's agent connections; nil without it.
	readers *agentpool.AgentReaders
	// records is the output bucket the reconciler writes finished tasks'
	// records to; nil without an output API bucket.
	records *blob.Bucket
}

// CacheOptions returns the manager cache options the controller expects:
// managedFields stripped from every cached object (the controller never
// reads them, and at thousands of tasks they are a large share of the
// memory), of the Nodes' status only what placement reads (StripNode)
// and, of the EndpointSlices, only the agents' Service's in its
// namespace. Build the manager with them before calling Setup.
func CacheOptions(o Options) cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {
				Namespaces: map[string]cache.Config{o.AgentNamespace: {}},
				Label:      labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: o.AgentService}),
				Field:      fields.Everything(),
			},
			&corev1.Node{}: {Transform: StripNode},
		},
	}
}

// StripNode is the cache transform of Nodes: managedFields and the status
// lists the controller never reads (images, which a kubelet reports up
// to 50 of with every name and size, the volumes in use and attached)
// removed. Placement reads the labels, spec.unschedulable, spec.taints and
// the Ready condition, which stay. Other objects pass unchanged.
func StripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	n.Status.Images = nil
	n.Status.VolumesInUse = nil
	n.Status.VolumesAttached = nil
	return n, nil
}

// Setup adds the controller to mgr, which must not have started: the
// agent registry, the BashTask and BashWorkspace reconcilers, the orphan
// collector, the output API server when o.OutputAPI.Port is set, and the
// healthz and readyz ping checks; it registers the metrics with o.Metrics.
// mgr's scheme must know the built-in types and bashtask.dev/v1alpha1.
// ctx bounds the opening of the output bucket, nothing that runs later
// (the manager's context does). It returns an error when a required
// option is missing, when a metric is already registered, or when the
// manager refuses a runnable; mgr is then unusable. Call Close if the
// manager is never started.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) (op *Operator, err error) {
	if o.AgentTLS == nil {
		return nil, errors.New("operator: a TLS client configuration for the agents is required")
	}
	if o.AgentNamespace == "" || o.AgentService == "" {
		return nil, errors.New("operator: the agents' Service namespace and name are required")
	}
	clk := o.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	workers := max(o.Workers, 1)
	ropts := o.Controller
	if o.Fence != nil {
		ropts.Fence = o.Fence
	}
	fence := ropts.Fence
	op = &Operator{}
	defer func() {
		if err != nil {
			op.Close()
		}
	}()

	taskEvents := make(chan event.TypedGenericEvent[*bashtaskv1alpha1.BashTask], taskEventsCap)
	agentChanges := make(chan event.TypedGenericEvent[*corev1.Node], agentChangesCap)
	held := make(chan agentpool.HeldTask, heldTasksCap)
	registry, err := agentpool.NewAgentRegistry(agentpool.AgentRegistryOptions{
		Reader:           mgr.GetClient(),
		ServiceNamespace: o.AgentNamespace,
		ServiceName:      o.AgentService,
		PortName:         o.AgentPortName,
		TLS:              o.AgentTLS,
		Clock:            clk,
		Notify:           taskEvents,
		AgentChanged:     agentChanges,
		Held:             held,
		Fence:            fence,
		// Below AgentLostAfter, so that a workspace's tasks on a lost
		// node have ended before the workspace is restored elsewhere.
		WorkspaceLease: ropts.AgentLostAfter / 2,
		Log:            ctrl.Log.WithName("agents"),
	})
	if err != nil {
		return op, err
	}
	if err := registry.SetupWithManager(mgr); err != nil {
		return op, fmt.Errorf("adding the agent registry: %w", err)
	}
	op.Registry = registry

	op.Metrics = controllers.NewMetrics(registry.Agents)
	if err := op.registerMetrics(mgr, o.Metrics, fence); err != nil {
		return op, err
	}

	if o.OutputAPI.Port > 0 && o.OutputAPI.BucketURL != "" {
		// The output API reads a deleted task's record from this bucket.
		if op.records, err = blob.OpenBucket(ctx, o.OutputAPI.BucketURL); err != nil {
			return op, fmt.Errorf("opening the output bucket for task records: %w", err)
		}
		ropts.Records = bucketRecords{op.records}
	}
	recorder := mgr.GetEventRecorder(RecorderName)
	op.Tasks = controllers.NewBashTaskReconciler(mgr.GetClient(), mgr.GetAPIReader(), registry, recorder, clk, ropts, op.Metrics)
	if err := op.Tasks.SetupWithManager(mgr, taskEvents, workers); err != nil {
		return op, fmt.Errorf("setting up the BashTask controller: %w", err)
	}
	op.Workspaces = controllers.NewBashWorkspaceReconciler(mgr.GetClient(), mgr.GetAPIReader(), registry, recorder, clk, ropts)
	if err := op.Workspaces.SetupWithManager(mgr, agentChanges, workers); err != nil {
		return op, fmt.Errorf("setting up the BashWorkspace controller: %w", err)
	}
	op.Orphans, err = controllers.NewOrphanCollector(controllers.OrphanCollectorOptions{
		Cache: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Agents: registry, Held: held,
		Interval: ropts.OrphanCheckInterval, Metrics: op.Metrics, Log: ctrl.Log.WithName("orphans"),
		Workspaces: registry, Recorder: recorder,
	})
	if err != nil {
		return op, err
	}
	if err := op.Orphans.SetupWithManager(mgr); err != nil {
		return op, fmt.Errorf("adding the orphan collector: %w", err)
	}

	if o.OutputAPI.Port > 0 {
		if err := op.addOutputAPI(ctx, mgr, o); err != nil {
			return op, err
		}
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return op, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return op, err
	}
	return op, nil
}

// addOutputAPI adds the output.bashtask.dev server. It reads tasks from
// the manager's cache (and from kube-apiserver for one the cache does not
// have yet) and output from the agents, with the controller's client
// certificate, through connections of its own: the registry's are only
// on the leader.
// registerMetrics adds the task metrics, the agents' Watch stream ends,
// the workspace phases and, when the fence exports one, its refusal
// counter to reg; a nil reg registers nothing.
func (op *Operator) registerMetrics(mgr ctrl.Manager, reg prometheus.Registerer, fence agentpool.Fencer) error {
	if reg == nil {
		return nil
	}
	if err := op.Metrics.Register(reg); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	collectors := []prometheus.Collector{op.Registry.StreamEnds, controllers.NewWorkspacePhases(mgr.GetClient())}
	if f, ok := fence.(interface{ Collector() prometheus.Collector }); ok {
		collectors = append(collectors, f.Collector())
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}

func (op *Operator) addOutputAPI(ctx context.Context, mgr ctrl.Manager, o Options) error {
	readers, err := agentpool.NewAgentReaders(mgr.GetClient(), o.AgentNamespace, o.AgentService, o.AgentPortName, o.AgentTLS)
	if err != nil {
		return err
	}
	op.readers = readers
	srv, err := outputapi.New(ctx, outputapi.Config{
		BindAddress: o.OutputAPI.BindAddress, Port: o.OutputAPI.Port, CertDir: o.OutputAPI.CertDir,
		Kubeconfig: o.OutputAPI.Kubeconfig,
		// The cache's BashTask informer wakes the requests that wait
		// for a task's dispatch (outputapi.Config.Informers).
		Tasks: mgr.GetClient(), LiveTasks: mgr.GetAPIReader(), Informers: mgr.GetCache(),
		Agents: readers, PortForwards: readers, BucketURL: o.OutputAPI.BucketURL,
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(&outputAPIRunnable{srv: srv, readers: readers}); err != nil {
		return fmt.Errorf("adding the output API: %w", err)
	}
	op.OutputAPI = srv
	return nil
}

// Close closes the output API's agent connections. The manager's end does
// it too; Close is for a manager that never started (or to be sure), and
// may be called more than once.
func (op *Operator) Close() {
	if op == nil {
		return
	}
	if op.readers != nil {
		op.readers.Close()
	}
	if op.records != nil {
		_ = op.records.Close()
		op.records = nil
	}
}

// bucketRecords writes task records (internal/taskrecord) to a bucket.
type bucketRecords struct{ b *blob.Bucket }

// Write implements controllers.TaskRecords.
func (r bucketRecords) Write(ctx context.Context, bt *bashtaskv1alpha1.BashTask) error {
	return taskrecord.Write(ctx, r.b, bt)
}

// outputAPIRunnable serves the output API and closes its agent
// connections once it stopped, so that a manager's end leaves none open.
type outputAPIRunnable struct {
	srv     *outputapi.Server
	readers *agentpool.AgentReaders
}

// Start serves until ctx ends.
func (r *outputAPIRunnable) Start(ctx context.Context) error {
	defer r.readers.Close()
	return r.srv.Start(ctx)
}

// NeedLeaderElection is false: every replica serves output.
func (r *outputAPIRunnable) NeedLeaderElection() bool { return r.srv.NeedLeaderElection() }
