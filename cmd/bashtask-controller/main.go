// Command bashtask-controller reconciles BashTask resources: it schedules
// each task onto a node's bashtask-agent over mutually authenticated gRPC and
// writes the outcome back into the task's status.
package main

import (
	"cmp"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
	"github.com/bashtask/bashtask-operator/operator"
)

// options are the command's flags.
type options struct {
	metricsAddr, probeAddr         string
	pprofAddr                      string
	leaderElect                    bool
	leaderElectionNamespace        string
	leaseDuration, renewDeadline   time.Duration
	retryPeriod                    time.Duration
	agentService, agentNamespace   string
	agentPortName, agentServerName string
	certFile, keyFile, caFile      string
	workers                        int
	qps                            float32
	burst                          int
	maxRunningPerOwner             int
	fairShare                      bool
	progressInterval, agentLost    time.Duration
	runningDelay                   time.Duration
	workspaceRefresh               time.Duration
	workspaceIdleRefresh           time.Duration
	workspaceSnapshotAfterTask     time.Duration
	orphanCheckInterval            time.Duration
	statusBudget                   int
	maxTimeout                     int32
	defaultTTL                     int32
	ttlDeletesGitOpsManaged        bool
	agentTolerations               string
	outputAPIPort                  int
	outputAPIBind                  string
	outputAPICertDir               string
	outputBucketURL                string
	zapOpts                        zap.Options
}

func main() {
	if err := newCommand().ExecuteContext(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "bashtask-controller:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	o := &options{}
	d := controllers.DefaultOptions()
	cmd := &cobra.Command{
		Use:           "bashtask-controller",
		Short:         "Reconcile BashTask resources through the node agents",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(cmd *cobra.Command, _ []string) error { return run(cmd, o) },
	}
	cmd.AddCommand(newReleaseTasksCommand())
	f := cmd.Flags()
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 disables it")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	f.StringVar(&o.pprofAddr, "pprof-bind-address", "", "address of the Go profiler's /debug/pprof endpoints (plain HTTP, unauthenticated: bind to loopback); empty or 0 disables them")
	f.BoolVar(&o.leaderElect, "leader-elect", true, "elect one active replica through a Lease, so several replicas can run")
	f.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease; empty means the namespace the controller runs in")
	f.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long other replicas wait, after they last saw the leader renew its Lease, before they may take it over")
	f.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives up; it stops dispatching and writing status once its last renewal is this old (must be shorter than the lease duration: the difference is the fencing margin)")
	f.DurationVar(&o.retryPeriod, "leader-election-retry-period", 2*time.Second, "time between two attempts to acquire or renew the Lease")
	f.StringVar(&o.agentService, "agent-service", "bashtask-agent", "name of the agents' headless Service, whose EndpointSlices list the agents")
	f.StringVar(&o.agentNamespace, "agent-namespace", "bashtask-system", "namespace of the agents' Service")
	f.StringVar(&o.agentPortName, "agent-port-name", "grpc", "name of the agents' gRPC port in the EndpointSlices; empty takes the first port")
	f.StringVar(&o.agentServerName, "agent-server-name", "", "name the agents' serving certificates must be valid for; empty means <agent-service>.<agent-namespace>.svc")
	f.StringVar(&o.certFile, "tls-cert-file", "/etc/bashtask/tls/tls.crt", "client certificate presented to the agents (re-read when it changes)")
	f.StringVar(&o.keyFile, "tls-key-file", "/etc/bashtask/tls/tls.key", "private key of --tls-cert-file")
	f.StringVar(&o.caFile, "tls-ca-file", "/etc/bashtask/tls/ca.crt", "CA bundle the agents' certificates must chain to")
	f.IntVar(&o.workers, "workers", 16, "BashTasks reconciled concurrently; a pass may wait on an agent's Start, so more workers than cores pay off")
	// Each short task costs about four requests (two status writes, two
	// events); client-side limits near controller-runtime's defaults would
	// cap the controller at a few dozen tasks per second, long before the
	// API server's own priority and fairness limits apply.
	f.Float32Var(&o.qps, "kube-api-qps", 500, "sustained requests per second to the API server")
	f.IntVar(&o.burst, "kube-api-burst", 1000, "burst of requests to the API server")
	f.IntVar(&o.maxRunningPerOwner, "max-running-per-owner", 0, "running tasks allowed per spec.owner; 0 means no limit")
	f.BoolVar(&o.fairShare, "fair-share", d.FairShare, "hand an agent's free task slots to the waiting tasks in fair turns: the task whose spec.owner runs the fewest tasks first (tasks without an owner count as one owner), then the one that waited longest; false gives a freed slot to whichever waiting task retries first")
	f.DurationVar(&o.progressInterval, "progress-interval", d.ProgressInterval, "shortest time between two output-tail refreshes of a running task's status")
	f.DurationVar(&o.runningDelay, "running-status-delay", d.RunningStatusDelay, "how long after dispatch the first Running status is held back; a task that ends sooner is written once, terminal")
	f.DurationVar(&o.workspaceRefresh, "workspace-refresh-interval", d.WorkspaceRefreshInterval, "time between two reads of a Ready BashWorkspace's state on its agent (bytes used, running tasks) when none of its tasks changed")
	f.DurationVar(&o.workspaceIdleRefresh, "workspace-idle-refresh-interval", d.WorkspaceIdleRefreshInterval, "time between two reads of a Ready BashWorkspace that runs no task and has no spec.egress.inject: its state changes only with a task, its agent's disconnect or return, or its Node's deletion, each of which reads it at once; 0 uses --workspace-refresh-interval")
	f.DurationVar(&o.workspaceSnapshotAfterTask, "workspace-snapshot-after-task", d.WorkspaceSnapshotAfterTask, "how long after its last task ended a BashWorkspace that changed since its last snapshot is snapshotted, unless its spec.snapshot.afterTaskSeconds says otherwise; 0 turns it off")
	f.DurationVar(&o.agentLost, "agent-lost-after", d.AgentLostAfter, "time an agent may be unreachable before its running tasks become AgentLost")
	f.DurationVar(&o.orphanCheckInterval, "orphan-check-interval", d.OrphanCheckInterval, "time between two checks of every task the agents hold against the API; a task whose BashTask no longer exists is stopped and forgotten (also checked on every agent connect and deletion); 0 disables the periodic check")
	f.IntVar(&o.statusBudget, "status-budget-bytes", d.StatusBudgetBytes, "largest JSON encoding of a task's status, in bytes; tails are shortened from the front to fit")
	f.Int32Var(&o.maxTimeout, "max-timeout-seconds", d.MaxTimeoutSeconds, "longest timeout a task may ask for, in seconds (spec.timeoutSeconds, or spec.timeoutMilliseconds): a task over it ends InvalidSpec before dispatch, never cut short; a task that asks for none gets 120 s or this, whichever is less; 0 is no cap")
	f.Int32Var(&o.defaultTTL, "default-ttl-seconds-after-finished", ptr.Deref(d.DefaultTTLSecondsAfterFinished, -1), "seconds after which finished tasks without spec.ttlSecondsAfterFinished are deleted (their output stays readable through the output API from --output-bucket-url); negative keeps them")
	f.BoolVar(&o.ttlDeletesGitOpsManaged, "ttl-deletes-gitops-managed", false, "let the TTL delete tasks an Argo CD or Flux annotation or label marks as managed; by default they are kept, since the tool would create them again and re-run the command")
	f.StringVar(&o.agentTolerations, "agent-tolerations", "", `the agent pods' tolerations as configured (a JSON array of core/v1 Tolerations; the chart renders it from agent.tolerations), without the ones the DaemonSet controller adds: a node with a NoSchedule or NoExecute taint none of them tolerates gets no new task or workspace; empty means none`)
	f.IntVar(&o.outputAPIPort, "output-api-port", 0, "HTTPS port of the output.bashtask.dev aggregated API (bashtasks/log, docs/output.md), served on every replica; 0 disables it")
	f.StringVar(&o.outputAPIBind, "output-api-bind-address", "0.0.0.0", "address the output API listens on")
	f.StringVar(&o.outputAPICertDir, "output-api-cert-dir", "/etc/bashtask/output-api", "directory of the output API's serving certificate, tls.crt and tls.key; a self-signed pair is generated there when they are missing")
	f.StringVar(&o.outputBucketURL, "output-bucket-url", "", "gocloud.dev blob URL of the bucket the agents upload output to (their --output-bucket-url), read with the controller's own credentials for output an agent no longer holds; empty (or another bucket than a status's spill URL names) asks the task's node's agent to read it from its own bucket")
	zapFlags := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.zapOpts.BindFlags(zapFlags)
	f.AddGoFlagSet(zapFlags)
	// --kubeconfig, registered by controller-runtime on the standard flag
	// set; in a pod the in-cluster configuration is used instead.
	f.AddGoFlagSet(flag.CommandLine)
	return cmd
}

func run(cmd *cobra.Command, o *options) error {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zapOpts)))
	log := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := bashtaskv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}

	tolerations, err := controllers.ParseAgentTolerations(o.agentTolerations)
	if err != nil {
		return err
	}

	serverName := cmp.Or(o.agentServerName, fmt.Sprintf("%s.%s.svc", o.agentService, o.agentNamespace))
	tlsCfg, err := agentTLS(o, serverName)
	if err != nil {
		return err
	}

	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	restCfg.QPS, restCfg.Burst = o.qps, o.burst

	// With leader election, the manager's elector holds the Lease through
	// a LeaderFence, which the registry and the reconciler ask before
	// every agent call and status write (docs/architecture.md, leader
	// fencing).
	var fence *agentpool.LeaderFence
	var fencer agentpool.Fencer
	var lock resourcelock.Interface
	if o.leaderElect {
		if err := o.checkLeaderTimings(); err != nil {
			return err
		}
		if fence, err = newLeaderFence(restCfg, o); err != nil {
			return err
		}
		fencer, lock = fence, fence
	}

	ropts := o.reconcilerOptions(tolerations)
	outputAPI, err := outputAPIOptions(o)
	if err != nil {
		return err
	}
	opOpts := operator.Options{
		AgentNamespace: o.agentNamespace,
		AgentService:   o.agentService,
		AgentPortName:  o.agentPortName,
		AgentTLS:       tlsCfg,
		Clock:          clock.RealClock{},
		Controller:     ropts,
		Workers:        o.workers,
		Fence:          fencer,
		Metrics:        metrics.Registry,
		OutputAPI:      outputAPI,
	}

	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		PprofBindAddress:        o.pprofAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: o.leaderElectionNamespace,
		LeaseDuration:           &o.leaseDuration,
		RenewDeadline:           &o.renewDeadline,
		RetryPeriod:             &o.retryPeriod,
		// The manager's elector renews through the fence, which is how
		// the fence knows when this controller last renewed.
		LeaderElectionResourceLockInterface: lock,
		Cache:                               operator.CacheOptions(opOpts),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	op, err := operator.Setup(cmd.Context(), mgr, opOpts)
	if err != nil {
		return err
	}
	defer op.Close()

	log.Info("Starting", "agentService", o.agentNamespace+"/"+o.agentService, "agentServerName", serverName,
		"maxRunningPerOwner", o.maxRunningPerOwner, "fairShare", o.fairShare, "agentLostAfter", o.agentLost)
	if err := mgr.Start(cmd.Context()); err != nil && !errors.Is(err, cmd.Context().Err()) {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// agentTLS returns the client TLS configuration for the agents: the
// controller's certificate from --cert-file and --key-file, the agents' CA
// from --ca-file, and serverName as the name the agents' certificate must
// carry.
func agentTLS(o *options, serverName string) (*tls.Config, error) {
	files, err := tlsutil.NewFiles(o.certFile, o.keyFile, o.caFile)
	if err != nil {
		return nil, fmt.Errorf("loading the client certificate for the agents: %w", err)
	}
	tlsCfg, err := tlsutil.ClientConfig(files, serverName)
	if err != nil {
		return nil, fmt.Errorf("building the TLS configuration for the agents: %w", err)
	}
	return tlsCfg, nil
}

// reconcilerOptions are the reconcilers' settings from the flags, on top
// of controllers.DefaultOptions.
func (o *options) reconcilerOptions(tolerations []corev1.Toleration) controllers.Options {
	ropts := controllers.DefaultOptions()
	ropts.MaxRunningPerOwner = o.maxRunningPerOwner
	ropts.FairShare = o.fairShare
	ropts.ProgressInterval = o.progressInterval
	ropts.AgentLostAfter = o.agentLost
	ropts.WorkspaceRefreshInterval = o.workspaceRefresh
	ropts.WorkspaceIdleRefreshInterval = o.workspaceIdleRefresh
	ropts.WorkspaceSnapshotAfterTask = o.workspaceSnapshotAfterTask
	ropts.RunningStatusDelay = o.runningDelay
	ropts.OrphanCheckInterval = o.orphanCheckInterval
	ropts.StatusBudgetBytes = o.statusBudget
	ropts.MaxTimeoutSeconds = o.maxTimeout
	ropts.TTLDeletesGitOpsManaged = o.ttlDeletesGitOpsManaged
	ropts.AgentTolerations = tolerations
	ropts.DefaultTTLSecondsAfterFinished = nil
	if o.defaultTTL >= 0 {
		ttl := o.defaultTTL
		ropts.DefaultTTLSecondsAfterFinished = &ttl
	}
	return ropts
}
