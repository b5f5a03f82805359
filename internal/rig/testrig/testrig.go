// Package testrig runs a whole BashTask system inside one test process: a
// real kube-apiserver and etcd (envtest), real agent servers on loopback
// addresses over mTLS, and the controller's manager. Tests use it to check
// behaviour end to end without separate processes; the e2e suite runs the
// same components as processes through bashtask-local.
package testrig

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"

	// The agents upload to file:// buckets.
	_ "gocloud.dev/blob/fileblob"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/internal/mounts"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
	"github.com/bashtask/bashtask-operator/operator"
)

// Options shape a rig.
type Options struct {
	// Agents to run; nil means localcluster.LoopbackAgents(2).
	Agents []localcluster.Agent
	// Controller are the reconciler options; the zero value means
	// controllers.DefaultOptions with a 500 ms retry interval.
	Controller *controllers.Options
	// Workers is the number of concurrent reconciles; zero means 4.
	Workers int
	// AgentCapacity is each agent's maximum of running tasks; zero means
	// 16.
	AgentCapacity int
	// AgentCapacities overrides AgentCapacity for the agents of the nodes
	// it names.
	AgentCapacities map[string]int
	// NoController starts no controller: a test runs its own (as
	// processes, with leader election) against the agents.
	NoController bool
	// Tenant runs the agents at the tenant isolation level (root only),
	// with the static bashtask-shim (internal/rig/testshim) and each agent a
	// range of task UIDs and a cgroup parent of its own. Workspaces need
	// it: an agent at the process level refuses them.
	Tenant bool
	// TaskDiskBytes, with Tenant, gives each task directory and each
	// workspace a file system of this size (the agent's --task-disk-size,
	// where the host has loop devices and mkfs.ext4), and caps what one
	// may ask for at four times that (--task-disk-cap). Zero: no disk
	// quota.
	TaskDiskBytes int64
	// Unary and Stream, when set, intercept every call each agent serves,
	// so a test can see what the agents were asked and what they answered.
	Unary  grpc.UnaryServerInterceptor
	Stream grpc.StreamServerInterceptor
	// OutputAPI serves output.bashtask.dev from the controller's manager,
	// as the controller does, behind kube-apiserver's front proxy (set up
	// for it), and has every agent upload to one file:// bucket,
	// BucketDir, which the server reads once an agent forgot a task. It is
	// down while RestartController restarts the controller, and needs
	// the controller (not NoController).
	OutputAPI bool
	// SharedBucket gives every agent one file:// bucket, as with
	// OutputAPI, without the output API: a snapshot one agent writes is
	// one another restores.
	SharedBucket bool
}

// Rig is a running control plane, agents and controller.
type Rig struct {
	// Env is the API server; Env.Config reaches it as an administrator.
	Env *testenv.Env
	// Client is an uncached client.
	Client client.Client
	// Agents are the running agents, by node name.
	Agents map[string]*Agent
	// Registry is the controller's view of the agents.
	Registry *agentpool.AgentRegistry
	// Orphans is the controller's check for tasks whose BashTask is gone.
	Orphans *controllers.OrphanCollector
	// Metrics are the controller's metrics, registered with a registry
	// of the controller's own, not the process-wide one.
	Metrics *controllers.Metrics
	// Workspaces is the controller's BashWorkspace reconciler.
	Workspaces *controllers.BashWorkspaceReconciler
	// Dir holds certificates and the agents' state directories.
	Dir string
	// Certs are the agents' and the controller's certificates.
	Certs *localcluster.Certs
	// BucketDir is the directory of the agents' shared file:// bucket
	// with Options.OutputAPI or SharedBucket; empty otherwise (each agent uploads to
	// <StateDir>/uploads).
	BucketDir string

	cancel context.CancelFunc
	done   chan struct{}

	// outputPort is the output API's port, served by the controller's
	// manager; 0 when none is served. outputKubeconfig and bucketURL are
	// its Kubeconfig and BucketURL; outputRegistered is set once its
	// APIService exists.
	outputPort       int
	outputKubeconfig string
	bucketURL        string
	outputRegistered bool

	// The controller runs under a context of its own so that
	// RestartController can end it while the agents keep running.
	ctx         context.Context
	ctrlCancel  context.CancelFunc
	ctrlFiles   *tlsutil.Files
	ctrlOpts    controllers.Options
	ctrlWorkers int
}

// Agent is one in-process agent server.
type Agent struct {
	// Node is the agent's node name; Addr its host:port.
	Node, Addr string
	// Server is the agent.
	Server *agent.Server
	// StateDir is the agent's --state-dir.
	StateDir string

	grpc   *grpc.Server
	tls    *tls.Config
	opts   []grpc.ServerOption
	cancel context.CancelFunc
	done   chan struct{}
	// offline is set between Disconnect and Reconnect.
	offline atomic.Bool
	// cfg and files start the agent again (Rig.RestartAgent).
	cfg   agent.Config
	files *tlsutil.Files
	// stop makes Stop happen once.
	stop sync.Once
}

// Disconnect stops serving gRPC, as if the agent vanished from the network;
// its tasks keep running until Stop.
func (a *Agent) Disconnect() {
	a.offline.Store(true)
	a.grpc.Stop()
}

// Reconnect serves gRPC again at the same address after Disconnect, as if
// the agent came back on the network; the controller's Watch stream
// reconnects and gets the agent's current tasks.
func (a *Agent) Reconnect() error {
	lis, err := net.Listen("tcp", a.Addr)
	if err != nil {
		return err
	}
	a.grpc = newGRPCServer(a.tls, a.Server, a.opts...)
	go func() { _ = a.grpc.Serve(lis) }()
	a.offline.Store(false)
	return nil
}

func newGRPCServer(tlsCfg *tls.Config, srv *agent.Server, extra ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(tlsCfg)),
		// As bashtask-agent serve: a Start may be far over gRPC's 4 MiB
		// default.
		grpc.MaxRecvMsgSize(agentv1.MaxRequestBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true})}, extra...)...)
	srv.Register(g)
	return g
}

// Stop ends the agent: its running tasks are stopped, its server closed.
// Later calls do nothing.
func (a *Agent) Stop() {
	a.stop.Do(func() {
		a.cancel()
		<-a.done
		a.grpc.Stop()
		_ = a.Server.Close()
	})
}

// Shutdown stops the agent as bashtask-agent does on SIGTERM: it drains
// first, for at most workspaceTimeout (Server.Drain: it reports itself
// draining, stops its tasks and waits while the controller moves its
// workspaces), then stops as Stop does. It returns the drain's result.
func (a *Agent) Shutdown(workspaceTimeout time.Duration) agent.DrainResult {
	ctx, cancel := context.WithTimeout(context.Background(), workspaceTimeout)
	defer cancel()
	res := a.Server.Drain(ctx)
	a.Stop()
	return res
}

// RestartAgent starts the node's agent again after Stop or Shutdown, at
// its address with its configuration and state directory, as a
// DaemonSet's new pod on the same node: it takes up the workspaces its
// state directory holds. Agents[node] is the new agent afterwards.
func (r *Rig) RestartAgent(node string) error {
	old := r.Agents[node]
	if old == nil {
		return fmt.Errorf("no agent on node %s", node)
	}
	old.Stop()
	a, err := startAgent(r.ctx, old.cfg, old.Addr, old.files, old.opts)
	if err != nil {
		return fmt.Errorf("restarting the agent of %s: %w", node, err)
	}
	r.Agents[node] = a
	return nil
}

// Start launches the rig. Stop it with Stop.
func Start(opts Options) (rig *Rig, err error) {
	if opts.Agents == nil {
		opts.Agents = localcluster.LoopbackAgents(2)
	}
	copts := controllers.DefaultOptions()
	copts.RetryInterval = 500 * time.Millisecond
	if opts.Controller != nil {
		copts = *opts.Controller
	}
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	if opts.OutputAPI && opts.NoController {
		return nil, errors.New("testrig: the output API is served by the controller: OutputAPI needs a controller")
	}
	dir, err := os.MkdirTemp("", "bashtask-rig-")
	if err != nil {
		return nil, err
	}
	certs, err := localcluster.IssueCerts(dir+"/certs", localcluster.AgentServerName, time.Hour)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	var frontProxy *localcluster.Certs
	if opts.OutputAPI {
		frontProxy = certs
	}
	env, err := testenv.StartWith(frontProxy)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Rig{Env: env, Client: env.Client, Agents: map[string]*Agent{}, Dir: dir, Certs: certs, cancel: cancel, done: make(chan struct{})}
	defer func() {
		if err != nil {
			r.Stop()
		}
	}()
	bucketURL := ""
	if opts.OutputAPI || opts.SharedBucket {
		// Temporary files next to the objects, so that fileblob's rename
		// stays on one file system.
		r.BucketDir = filepath.Join(dir, "bucket")
		if err := os.MkdirAll(r.BucketDir, 0o700); err != nil {
			return nil, err
		}
		bucketURL = "file://" + r.BucketDir + "?no_tmp_dir=true"
	}
	var serverOpts []grpc.ServerOption
	if opts.Unary != nil {
		serverOpts = append(serverOpts, grpc.ChainUnaryInterceptor(opts.Unary))
	}
	if opts.Stream != nil {
		serverOpts = append(serverOpts, grpc.ChainStreamInterceptor(opts.Stream))
	}
	port, err := localcluster.FreePort(opts.Agents[0].IP)
	if err != nil {
		return nil, err
	}
	var tenant *tenantLevel
	if opts.Tenant {
		if tenant, err = newTenantLevel(opts.TaskDiskBytes); err != nil {
			return nil, err
		}
	}
	for i, a := range opts.Agents {
		cfg := agent.Config{
			NodeName:         a.Node,
			PodName:          "bashtask-agent-" + a.Node,
			StateDir:         r.Dir + "/" + a.Node,
			BucketURL:        bucketURL,
			MaxConcurrent:    cmp.Or(opts.AgentCapacities[a.Node], opts.AgentCapacity, 16),
			ProgressInterval: 200 * time.Millisecond,
			// A parent cgroup per process and node: test packages run
			// side by side, and an executor removes the parent it made
			// when it closes, under another package's agents.
			Executor: executor.Config{Shell: "/bin/bash", CgroupParent: fmt.Sprintf("bashtask-rig-%d-%s", os.Getpid(), a.Node)},
			// Parts of a running stream within a second, so tests of
			// output that survives the agent wait little.
			PartBytes:    1 << 20,
			PartInterval: time.Second,
		}
		if tenant != nil {
			if err := tenant.configure(&cfg, i, r.Dir+"/work-"+a.Node); err != nil {
				return nil, err
			}
		}
		ag, err := startAgent(ctx, cfg, net.JoinHostPort(a.IP, strconv.Itoa(port)), certs.Agent, serverOpts)
		if err != nil {
			return nil, fmt.Errorf("starting the agent of %s: %w", a.Node, err)
		}
		r.Agents[a.Node] = ag
	}
	if err := localcluster.CreateAgentObjects(ctx, r.Client, opts.Agents, port); err != nil {
		return nil, err
	}
	r.ctx, r.ctrlFiles, r.ctrlOpts, r.ctrlWorkers = ctx, certs.Controller, copts, opts.Workers
	if opts.NoController {
		return r, nil
	}
	if opts.OutputAPI {
		if err := r.prepareOutputAPI(bucketURL); err != nil {
			return nil, fmt.Errorf("preparing the output API: %w", err)
		}
	}
	if err := r.startController(); err != nil {
		return nil, err
	}
	return r, nil
}

// RestartController stops the controller's manager (its cache, workers,
// agent connections and orphan checks) as a process exit would, then
// starts a new one with the same options, which starts from nothing: a
// fresh cache, new Watch streams to every agent. It returns once every
// agent is connected and ready again. Registry and Orphans name the new
// controller's afterwards.
func (r *Rig) RestartController() error {
	r.ctrlCancel()
	<-r.done
	r.done = make(chan struct{})
	r.Registry, r.Orphans, r.Metrics, r.Workspaces = nil, nil, nil, nil
	return r.startController()
}

// Stop ends the controller, the agents and the control plane, and removes
// the rig's files.
func (r *Rig) Stop() {
	r.cancel()
	for _, a := range r.Agents {
		a.Stop()
	}
	if r.Registry != nil {
		<-r.done
	}
	_ = r.Env.Stop()
	if r.Dir != "" {
		// Workspaces the rig's agents made and no deletion removed keep
		// their file systems mounted (as an agent restart must find them):
		// unmounted here, so that no loop device outlives the rig.
		_ = mounts.UnmountUnder(r.Dir)
		_ = os.RemoveAll(r.Dir)
	}
}

func startAgent(ctx context.Context, cfg agent.Config, addr string, files *tlsutil.Files, serverOpts []grpc.ServerOption) (*Agent, error) {
	node, stateDir := cfg.NodeName, cfg.StateDir
	tlsCfg, err := tlsutil.ServerConfig(files, localcluster.ControllerIdentity)
	if err != nil {
		return nil, err
	}
	srv, err := agent.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	g := newGRPCServer(tlsCfg, srv, serverOpts...)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Join(err, srv.Close())
	}
	go func() { _ = g.Serve(lis) }()
	runCtx, cancel := context.WithCancel(ctx)
	a := &Agent{Node: node, Addr: addr, Server: srv, StateDir: stateDir, grpc: g, tls: tlsCfg, opts: serverOpts, cancel: cancel, done: make(chan struct{}),
		cfg: cfg, files: files}
	go func() { defer close(a.done); _ = srv.Run(runCtx) }()
	return a, nil
}

func (r *Rig) startController() error {
	files, opts, workers := r.ctrlFiles, r.ctrlOpts, r.ctrlWorkers
	ctx, cancel := context.WithCancel(r.ctx)
	r.ctrlCancel = cancel
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(logLevel())))
	tlsCfg, err := tlsutil.ClientConfig(files, localcluster.AgentServerName)
	if err != nil {
		return err
	}
	oopts := operator.Options{
		AgentNamespace: localcluster.AgentNamespace,
		AgentService:   localcluster.AgentService,
		AgentPortName:  localcluster.AgentPortName,
		AgentTLS:       tlsCfg,
		Clock:          clock.RealClock{},
		Controller:     opts,
		Workers:        workers,
		// A registry per manager: a restarted controller registers the
		// same collectors again, which the process-wide registry refuses.
		Metrics: prometheus.NewRegistry(),
	}
	if r.outputPort != 0 {
		oopts.OutputAPI = operator.OutputAPIOptions{
			Port: r.outputPort, BindAddress: net.IPv4(127, 0, 0, 1), CertDir: r.Certs.OutputAPIDir,
			Kubeconfig: r.outputKubeconfig, BucketURL: r.bucketURL,
		}
	}
	mgr, err := ctrl.NewManager(r.Env.Config, ctrl.Options{
		Scheme: r.Env.Scheme,
		// Each manager of a restarted rig registers its controllers
		// under the same names.
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  operator.CacheOptions(oopts),
	})
	if err != nil {
		return err
	}
	op, err := operator.Setup(ctx, mgr, oopts)
	if err != nil {
		return err
	}
	registry := op.Registry
	r.Registry = registry
	r.Workspaces = op.Workspaces
	r.Orphans = op.Orphans
	r.Metrics = op.Metrics
	go func() {
		defer close(r.done)
		defer op.Close()
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testrig: manager:", err)
		}
	}()
	if r.outputPort != 0 {
		if err := r.registerOutputAPI(); err != nil {
			return fmt.Errorf("serving the output API: %w", err)
		}
	}
	// Start from a steady state: every agent connected and ready (but
	// those a test disconnected).
	want := 0
	for _, a := range r.Agents {
		if !a.offline.Load() {
			want++
		}
	}
	// A restart with many large tasks first lists them all into the new
	// cache, on a machine the test may share: allow for it.
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		ready := 0
		for _, a := range registry.Agents() {
			if a.Ready {
				ready++
			}
		}
		if ready >= want {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	elected := false
	select {
	case <-mgr.Elected():
		elected = true // the caches synced and the runnables started
	default:
	}
	return fmt.Errorf("agents not all ready after 90s (manager started its runnables: %v): %+v", elected, registry.Agents())
}

// prepareOutputAPI chooses the output API's port and writes the
// kubeconfig it authenticates requests with; the controller's manager
// then serves it (operator.Setup), as every controller replica does.
func (r *Rig) prepareOutputAPI(bucketURL string) error {
	r.outputKubeconfig = filepath.Join(r.Dir, "output-api.kubeconfig")
	if err := r.Env.WriteKubeconfig(r.outputKubeconfig); err != nil {
		return err
	}
	port, err := localcluster.FreePort("127.0.0.1")
	if err != nil {
		return err
	}
	r.outputPort, r.bucketURL = port, bucketURL
	return nil
}

// registerOutputAPI registers the output API with kube-apiserver
// (localcluster.CreateOutputAPIObjects) the first time, and waits until
// kube-apiserver serves it: after a RestartController too, since the
// server runs in the controller's manager.
func (r *Rig) registerOutputAPI() error {
	if !r.outputRegistered {
		if err := localcluster.CreateOutputAPIObjects(r.ctx, r.Client, r.outputPort, r.Certs); err != nil {
			return err
		}
		r.outputRegistered = true
	}
	return localcluster.WaitOutputAPI(r.ctx, r.Env.Config, 60*time.Second)
}

// logLevel keeps test output to errors unless BASHTASK_TEST_VERBOSE is set.
func logLevel() zapcore.Level {
	if os.Getenv("BASHTASK_TEST_VERBOSE") != "" {
		return zapcore.Level(-2)
	}
	return zapcore.ErrorLevel
}
