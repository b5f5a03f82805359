package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	// Bucket drivers for --output-bucket-url (docs/agent.md, Uploads):
	// azblob://, file://, gs:// and s3:// (also S3-compatible servers
	// through ?endpoint=).
	_ "gocloud.dev/blob/azureblob"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/api/resource"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// maxShimPoolSize bounds --shim-pool-size: each pooled shim is a process
// and a cgroup kept per network tasks ask for.
const maxShimPoolSize = 64

// serveOptions are the flags of the agent server.
type serveOptions struct {
	listen             string
	nodeName           string
	podName            string
	stateDir           string
	bucketURL          string
	maxConcurrent      int
	maxWorkspaces      int
	progressInterval   time.Duration
	controllerIdentity string
	certFile           string
	keyFile            string
	caFile             string
	metricsAddr        string
	pprofAddr          string
	healthAddr         string
	shell              string
	ambientEnv         string
	ambientAllow       []string
	cgroups            string
	cgroupRoot         string
	cgroupParent       string
	workDirRoot        string
	runAsUser          string
	isolation          string
	taskIdentity       string
	taskUIDRange       string
	taskNetwork        string
	allowedNetworks    []string
	egressCIDR         string
	egressDeny         []string
	egressResolvers    []string
	taskTmpSize        int64
	taskRunPaths       []string
	taskDiskSize       string
	taskDiskCap        string
	taskDiskInodes     int64
	taskProcs          int64
	unenforcedLimits   string
	shimPoolSize       int
	shimPath           string
	backoffInitial     time.Duration
	backoffMax         time.Duration
	uploadTimeout      time.Duration
	partBytes          int64
	partInterval       time.Duration
	shutdownTimeout    time.Duration
	workspaceTimeout   time.Duration
	logFormat          string
	logLevel           string
	imageCacheDir      string
	imageCacheSize     string
	defaultImage       string
	registryMirrors    []string
	registryCAFile     string
	insecureRegistries []string
}

// addServe makes root run the agent server (docs/agent.md)
// with the server's flags, and adds the same as the `serve` subcommand for
// explicitness in manifests.
func addServe(root *cobra.Command) {
	o := &serveOptions{}
	long := `Serve the bashtask.agent.v1.Executor gRPC protocol over mutual TLS: run
BashTask commands on this node for the controller, keep their records and
output under --state-dir, recover tasks of an earlier agent process as
AgentRestarted, upload spill files to --output-bucket-url, and serve
Prometheus metrics and health probes.

Environment: NODE_NAME and POD_NAME are the defaults of --node-name and
--pod-name (set them from the downward API). Bucket credentials come from
the driver's usual sources (for s3://, AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY); no variable of the agent's reaches a task at the
tenant level unless --ambient-allow names it, and the process level's scrub
drops credential-shaped names and values.`
	root.Long = long
	root.RunE = func(cmd *cobra.Command, _ []string) error { return runServe(cmd.Context(), o) }
	root.Args = cobra.NoArgs
	bindServeFlags(root.Flags(), o)

	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve the executor over gRPC (the same as running bashtask-agent without a subcommand)",
		Long:  long,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runServe(cmd.Context(), o) },
	}
	bindServeFlags(serve.Flags(), o)
	root.AddCommand(serve)
}

func bindServeFlags(f *pflag.FlagSet, o *serveOptions) {
	f.StringVar(&o.listen, "listen", ":9443", "address of the gRPC (mTLS) server")
	f.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, reported to the controller and given to tasks as BASHTASK_NODE (default $NODE_NAME, else the host name)")
	f.StringVar(&o.podName, "pod-name", os.Getenv("POD_NAME"), "name of the agent's pod, reported to the controller (default $POD_NAME)")
	f.StringVar(&o.stateDir, "state-dir", "/var/lib/bashtask-agent", "directory of task records and output files, created 0700")
	f.StringVar(&o.bucketURL, "output-bucket-url", "", "gocloud.dev/blob bucket URL for full output streams (file://, s3://, gs:// or azblob://); empty means file://<state-dir>/uploads")
	f.IntVar(&o.maxConcurrent, "max-concurrent-tasks", agent.DefaultMaxConcurrent, "maximum number of tasks running at once")
	f.IntVar(&o.maxWorkspaces, "max-workspaces", agent.DefaultMaxWorkspaces, "maximum number of workspaces (BashWorkspace) this agent holds at --isolation=tenant, each a UID of --task-uid-range for its life, a directory (a file system of --task-disk-size where loop devices allow) and a network namespace")
	f.DurationVar(&o.progressInterval, "progress-interval", agent.DefaultProgressInterval, "minimum time between two progress events of a task")
	f.StringVar(&o.controllerIdentity, "controller-identity", "bashtask-controller", "identity (common name, DNS or URI SAN) a client certificate must carry")
	f.StringVar(&o.certFile, "tls-cert-file", "/etc/bashtask-agent/tls/tls.crt", "server certificate chain (PEM), re-read when it changes")
	f.StringVar(&o.keyFile, "tls-key-file", "/etc/bashtask-agent/tls/tls.key", "server private key (PEM), re-read when it changes")
	f.StringVar(&o.caFile, "tls-ca-file", "/etc/bashtask-agent/tls/ca.crt", "CA bundle (PEM) client certificates must chain to, re-read when it changes")
	f.StringVar(&o.metricsAddr, "metrics-address", ":9090", "address of the Prometheus /metrics endpoint (plain HTTP); empty disables it")
	f.StringVar(&o.pprofAddr, "pprof-address", "", "address of the Go profiler's /debug/pprof endpoints (plain HTTP, unauthenticated: bind to loopback); empty disables them")
	f.StringVar(&o.healthAddr, "health-probe-address", ":8081", "address of the /healthz and /readyz probe endpoints (plain HTTP); empty disables them")
	f.StringVar(&o.shell, "shell", executor.DefaultShell, "absolute path of the shell run as <shell> -c <command>")
	f.StringVar(&o.ambientEnv, "ambient-env", "", "which part of the agent's environment tasks get: allowlist (only --ambient-allow's names; "+
		"the tenant level's default), scrub (all but credential-shaped names and values; the process level's default) or inherit (everything: single-tenant nodes only)")
	f.StringSliceVar(&o.ambientAllow, "ambient-allow", nil, "names passed from the agent's environment in allowlist mode; their values reach every tenant's tasks, "+
		"so never name a credential of the agent's")
	f.StringVar(&o.cgroups, "cgroups", string(executor.CgroupAuto), "cgroup v2 use: auto, off or required")
	f.StringVar(&o.cgroupRoot, "cgroup-root", "", "cgroup v2 directory under which the tasks' parent cgroup is created; empty means detected")
	f.StringVar(&o.cgroupParent, "cgroup-parent", executor.DefaultCgroupParent, "name of the parent cgroup of tasks")
	f.StringVar(&o.workDirRoot, "work-dir-root", "", "where fresh per-task working directories are created; empty means the system temporary directory")
	f.StringVar(&o.runAsUser, "run-as-user", "", "numeric UID[:GID] tasks run as; empty means the agent's own user")
	f.StringVar(&o.isolation, "isolation", string(executor.IsolationProcess), "isolation level of tasks: process (a session, process group and cgroup each, one user for all) or tenant (also a leased UID, namespaces, a read-only root, private /tmp, Landlock and seccomp per task; see docs/security.md)")
	f.StringVar(&o.taskIdentity, "task-identity", "leased", "at --isolation=tenant: leased (a UID per task from --task-uid-range) or shared (every task runs as --run-as-user; single-tenant nodes only)")
	f.StringVar(&o.taskUIDRange, "task-uid-range", agent.DefaultTaskUIDRange.String(), "FIRST-LAST range of UIDs leased to tasks at --isolation=tenant, one per live task")
	f.StringVar(&o.taskNetwork, "task-network", "", "network of tasks whose spec names none: node (whatever this pod reaches), none (only loopback) or egress (a network namespace with a NATed route out that reaches neither this pod's addresses, link-local addresses, --egress-deny-cidr nor other tasks); none and egress need --isolation=tenant; empty means egress at --isolation=tenant, node at process")
	f.StringSliceVar(&o.allowedNetworks, "allowed-networks", nil, "networks a task may ask for (comma-separated or repeated): node, none, egress; others are refused with InvalidSpec; empty means egress,none at --isolation=tenant and node at process (the only one there)")
	f.StringVar(&o.egressCIDR, "egress-cidr", executor.DefaultEgressCIDR, "IPv4 range task addresses of network egress come from, a /30 per task; must not overlap a network tasks or this pod must reach")
	f.StringSliceVar(&o.egressDeny, "egress-deny-cidr", nil, "IPv4 CIDR tasks of network egress must not reach (repeatable): the cluster's pod and service ranges, the node network; loopback, link-local (169.254.0.0/16, the metadata address), multicast and this agent's own addresses are always denied")
	f.StringSliceVar(&o.egressResolvers, "egress-resolver", nil, "IPv4 address of a DNS server tasks of network egress get in /etc/resolv.conf and may reach on port 53 even inside a denied range (repeatable); empty means the non-loopback nameservers of this pod's /etc/resolv.conf (else of /run/systemd/resolve/resolv.conf)")
	f.StringSliceVar(&o.taskRunPaths, "task-run-paths", nil, "paths under /run of this pod's /run that tasks at --isolation=tenant reach (comma-separated or repeated), bound read-only into each task's own /run: the sockets of node daemons tasks need; empty means none")
	f.Int64Var(&o.taskTmpSize, "task-tmp-size", executor.DefaultTmpSizeBytes, "size in bytes of each task's private /tmp and /dev/shm at --isolation=tenant")
	f.StringVar(&o.taskDiskSize, "task-disk-size", "10Gi", "size of each fresh working directory at --isolation=tenant, a quantity (10Gi): a file system of its own on a loop device, so that a task that fills it fails alone (ENOSPC); 0 for no quota. Without loop devices tasks run without and their status says so")
	f.StringVar(&o.taskDiskCap, "task-disk-cap", "100Gi", "largest spec.resources.ephemeralStorage a task may ask for, a quantity; at least --task-disk-size")
	f.Int64Var(&o.taskDiskInodes, "task-disk-inodes", executor.DefaultDiskQuotaInodes, "inodes (files, directories, links) of each fresh working directory at --isolation=tenant; at most one per 4 KiB of its size")
	f.StringVar(&o.shimPath, "shim-path", "", "absolute path of the binary started as each task's shim at --isolation=tenant; empty: "+shimBinary+" beside this binary when it is there, else this binary itself")
	f.IntVar(&o.shimPoolSize, "shim-pool-size", executor.DefaultShimPoolSize, "task shims kept started ahead of tasks at --isolation=tenant, per network tasks ask for (each a blocked process of a few MiB, in a cgroup of its own); 0 for none")
	f.Int64Var(&o.taskProcs, "task-procs", executor.DefaultTaskProcs, "processes and threads of one task at --isolation=tenant when its spec sets no pids limit (pids.max, else RLIMIT_NPROC on its UID); -1 for no limit")
	f.StringVar(&o.unenforcedLimits, "unenforced-limits", string(agent.UnenforcedWarn), "what becomes of a task whose spec.resources asks for a limit this node does not enforce (a cgroup controller not delegated, no disk quota): warn (it runs, its status and a Warning event name the limit) or refuse (it ends StartFailed naming the limit)")
	f.DurationVar(&o.backoffInitial, "upload-backoff-initial", agent.DefaultUploadBackoffInitial, "wait after the first failed upload; doubled after each further failure")
	f.DurationVar(&o.backoffMax, "upload-backoff-max", agent.DefaultUploadBackoffMax, "maximum wait between upload attempts")
	f.DurationVar(&o.uploadTimeout, "upload-timeout", agent.DefaultUploadTimeout, "time limit of one upload attempt")
	f.Int64Var(&o.partBytes, "output-part-bytes", agent.DefaultPartBytes, fmt.Sprintf("largest part, in bytes, of a running task's stream uploaded while it runs, so that its output survives the node (docs/output.md); at least %d, or 0 to upload no parts", agent.MinPartBytes))
	f.DurationVar(&o.partInterval, "output-part-interval", agent.DefaultPartInterval, fmt.Sprintf("longest a running stream's new bytes wait for a part, the most output time lost with the node; at least %s", agent.MinPartInterval))
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "time given to open RPCs after the running tasks were stopped on SIGTERM")
	f.DurationVar(&o.workspaceTimeout, "shutdown-workspace-timeout", 30*time.Second, "on SIGTERM, longest wait for the controller to move this agent's workspaces to other nodes (snapshot, release) before the agent stops; 0 moves none. The pod's terminationGracePeriodSeconds must cover it plus --shutdown-timeout")
	f.StringVar(&o.imageCacheDir, "image-cache-dir", "", "directory of the node's image store at --isolation=tenant (unpacked layers, made 0700 and hidden from tasks); empty means <state-dir>/images")
	f.StringVar(&o.imageCacheSize, "image-cache-size", "20Gi", "disk budget of the image store, a quantity (20Gi) of unpacked layers: the least recently used images no task or workspace holds are evicted past it, and an image larger than it alone fails with ImageTooLarge; 0 for no limit")
	f.StringVar(&o.defaultImage, "default-image", "", "image of tasks and workspaces whose spec names none, at --isolation=tenant; empty means the node's root file system")
	f.StringArrayVar(&o.registryMirrors, "registry-mirror", nil, "HOST=MIRROR: pull images of registry HOST (docker.io, ghcr.io, registry:5000) from MIRROR first, then from HOST (repeatable; several mirrors of one host are tried in order)")
	f.StringVar(&o.registryCAFile, "registry-ca-file", "", "PEM bundle of certificate authorities trusted for registries and mirrors, beside the system's")
	f.StringArrayVar(&o.insecureRegistries, "insecure-registry", nil, "registry HOST[:PORT] spoken to over plain HTTP, for a local registry (repeatable); loopback and private addresses are plain HTTP without it")
	f.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
}

func runServe(ctx context.Context, o *serveOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	cfg, err := o.agentConfig(log)
	if err != nil {
		return err
	}
	files, err := tlsutil.NewFiles(o.certFile, o.keyFile, o.caFile)
	if err != nil {
		return fmt.Errorf("loading TLS files: %w", err)
	}
	cfg.CertCheck = files.Check
	tlsCfg, err := tlsutil.ServerConfig(files, o.controllerIdentity)
	if err != nil {
		return err
	}

	// Before the executor exists: orphans of tasks are re-parented to the
	// agent and reaped.
	if err := executor.BecomeSubreaper(); err != nil && !errors.Is(err, executor.ErrUnsupported) {
		return fmt.Errorf("becoming a child subreaper: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Images.Registerer = reg
	if cfg.Metrics, err = agent.NewMetrics(reg); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, unix.SIGTERM)
	defer stop()
	srv, err := agent.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := srv.Close(); err != nil {
			log.Error("closing the agent", "err", err)
		}
	}()

	g := newGRPCServer(tlsCfg)
	srv.Register(g)
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening for gRPC: %w", err)
	}

	errc := make(chan error, 4)
	httpServers := o.serveHTTP(reg, srv, errc)
	go func() { errc <- g.Serve(lis) }()
	log.Info("agent serving", "listen", lis.Addr().String(), "node", cfg.NodeName, "incarnation", srv.IncarnationID(),
		"stateDir", cfg.StateDir, "bucket", srv.BucketURL(), "controllerIdentity", o.controllerIdentity)

	// Run's stop begins only after the drain: cancelRun, not the signal,
	// ends its context.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	runDone := make(chan error, 1)
	go func() { runDone <- srv.Run(runCtx) }()
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
		// First the workspaces move (docs/workspaces.md, "Agent
		// shutdown"): the controller needs the agent's gRPC server for
		// it, which a failed server no longer is.
		if o.workspaceTimeout > 0 {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.workspaceTimeout)
			srv.Drain(dctx)
			cancel()
		}
	case serveErr = <-errc:
		log.Error("server failed; shutting down", "err", serveErr)
	}
	return errors.Join(serveErr, o.stop(ctx, cancelRun, runDone, g, httpServers))
}

// newGRPCServer returns the agent's gRPC server: mutual TLS from tlsCfg,
// the request size limit of the protocol, and keepalives.
func newGRPCServer(tlsCfg *tls.Config) *grpc.Server {
	return grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		// A Start may carry a 128 KiB command, 256 KiB of stdin and up to
		// 256 environment entries resolved from Secrets; gRPC's 4 MiB
		// default would refuse specs the API accepts.
		grpc.MaxRecvMsgSize(agentv1.MaxRequestBytes),
		// The controller keeps one Watch stream open per agent; pings
		// find a dead peer behind a silent network. MinTime is the
		// shortest ping interval accepted, the controller's (agentpool).
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
}

// serveHTTP starts the metrics, health and pprof listeners whose flags are
// set; a listener that fails sends its error to errc.
func (o *serveOptions) serveHTTP(reg *prometheus.Registry, srv *agent.Server, errc chan<- error) []*http.Server {
	var servers []*http.Server
	if o.metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		servers = append(servers, listenHTTP(o.metricsAddr, mux, errc))
	}
	if o.healthAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if ready, problems := srv.Readiness(); !ready {
				http.Error(w, strings.Join(problems, "\n"), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		servers = append(servers, listenHTTP(o.healthAddr, mux, errc))
	}
	if o.pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		servers = append(servers, listenHTTP(o.pprofAddr, mux, errc))
	}
	return servers
}

// stop ends the agent after its drain: Run stops the running tasks and
// ends the Watch streams first (cancelRun), so the controller sees the
// terminal events; then open RPCs get --shutdown-timeout, and the HTTP
// listeners 5 s. It returns Run's error.
func (o *serveOptions) stop(ctx context.Context, cancelRun context.CancelFunc, runDone <-chan error, g *grpc.Server, httpServers []*http.Server) error {
	cancelRun()
	err := <-runDone
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(o.shutdownTimeout):
		g.Stop()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, hs := range httpServers {
		_ = hs.Shutdown(sctx)
	}
	return err
}

func listenHTTP(addr string, h http.Handler, errc chan<- error) *http.Server {
	hs := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serving %s: %w", addr, err)
		}
	}()
	return hs
}

func (o *serveOptions) agentConfig(log *slog.Logger) (agent.Config, error) {
	mode, err := executor.ParseAmbientMode(o.ambientEnv)
	if err != nil {
		return agent.Config{}, fmt.Errorf("--ambient-env: %w", err)
	}
	node := o.nodeName
	if node == "" {
		if node, err = os.Hostname(); err != nil {
			return agent.Config{}, fmt.Errorf("--node-name not set and no host name: %w", err)
		}
	}
	user, err := parseUser(o.runAsUser)
	if err != nil {
		return agent.Config{}, err
	}
	isolation, err := executor.ParseIsolation(o.isolation)
	if err != nil {
		return agent.Config{}, fmt.Errorf("--isolation: %w", err)
	}
	network, allowed, err := o.networks(isolation)
	if err != nil {
		return agent.Config{}, err
	}
	uids, err := agent.ParseUIDRange(o.taskUIDRange)
	if err != nil {
		return agent.Config{}, fmt.Errorf("--task-uid-range: %w", err)
	}
	unenforced, err := agent.ParseUnenforcedPolicy(o.unenforcedLimits)
	if err != nil {
		return agent.Config{}, err
	}
	partBytes, err := o.checkLimits()
	if err != nil {
		return agent.Config{}, err
	}
	diskSize, diskCap, err := o.diskQuota()
	if err != nil {
		return agent.Config{}, err
	}
	shimPath, err := resolveShimPath(o.shimPath)
	if err != nil {
		return agent.Config{}, err
	}
	mask, err := o.tlsDirs()
	if err != nil {
		return agent.Config{}, err
	}
	cfg := agent.Config{
		NodeName:         node,
		PodName:          o.podName,
		StateDir:         o.stateDir,
		BucketURL:        o.bucketURL,
		MaxConcurrent:    o.maxConcurrent,
		MaxWorkspaces:    o.maxWorkspaces,
		ProgressInterval: o.progressInterval,
		Executor: executor.Config{
			Shell:             o.shell,
			AmbientEnv:        mode,
			AmbientAllowlist:  o.ambientAllow,
			Cgroups:           executor.CgroupMode(o.cgroups),
			CgroupRoot:        o.cgroupRoot,
			CgroupParent:      o.cgroupParent,
			WorkDirRoot:       o.workDirRoot,
			Isolation:         isolation,
			TmpSizeBytes:      o.taskTmpSize,
			DiskQuotaBytes:    diskSize,
			DiskQuotaCapBytes: diskCap,
			DiskQuotaInodes:   o.taskDiskInodes,
			TaskProcs:         o.taskProcs,
			ShimPoolSize:      cmp.Or(o.shimPoolSize, -1),
			ShimPath:          shimPath,
			MaskPaths:         mask,
			RunPaths:          o.taskRunPaths,
		},
		AllowedNetworks:      allowed,
		RunAs:                user,
		TaskUIDs:             uids,
		SharedIdentity:       o.taskIdentity == "shared",
		TaskNetwork:          network,
		UnenforcedLimits:     unenforced,
		UploadBackoffInitial: o.backoffInitial,
		UploadBackoffMax:     o.backoffMax,
		UploadTimeout:        o.uploadTimeout,
		PartBytes:            partBytes,
		PartInterval:         o.partInterval,
		Logger:               log,
	}
	if slices.Contains(allowed, executor.NetworkEgress) {
		if cfg.Executor.Egress, err = o.egressConfig(); err != nil {
			return agent.Config{}, err
		}
	}
	if cfg.Images, err = o.imageConfig(isolation); err != nil {
		return agent.Config{}, err
	}
	return cfg, nil
}

// imageConfig reads the --image-*, --default-image and --registry-*
// flags; images need the tenant isolation level.
func (o *serveOptions) imageConfig(isolation executor.Isolation) (agent.ImageConfig, error) {
	size, err := parseBytes("--image-cache-size", o.imageCacheSize)
	if err != nil {
		return agent.ImageConfig{}, err
	}
	if size == 0 {
		size = -1 // no limit
	}
	if o.defaultImage != "" && isolation != executor.IsolationTenant {
		return agent.ImageConfig{}, fmt.Errorf("--default-image %s: images need --isolation=tenant", o.defaultImage)
	}
	if o.imageCacheDir != "" && !filepath.IsAbs(o.imageCacheDir) {
		return agent.ImageConfig{}, fmt.Errorf("--image-cache-dir %q: want an absolute path", o.imageCacheDir)
	}
	mirrors := map[string][]string{}
	for _, m := range o.registryMirrors {
		host, mirror, ok := strings.Cut(m, "=")
		if !ok || host == "" || mirror == "" || strings.ContainsAny(host+mirror, "/ ") {
			return agent.ImageConfig{}, fmt.Errorf("--registry-mirror %q: want HOST=MIRROR, each a host[:port] without a scheme or path", m)
		}
		mirrors[host] = append(mirrors[host], mirror)
	}
	return agent.ImageConfig{
		CacheDir: o.imageCacheDir, CacheBytes: size, DefaultImage: o.defaultImage,
		Mirrors: mirrors, CAFile: o.registryCAFile, PlainHTTP: o.insecureRegistries,
	}, nil
}

// shimBinary is the file name of the shim binary (cmd/bashtask-shim) that
// --shim-path looks for beside the agent's own binary.
const shimBinary = "bashtask-shim"

// resolveShimPath returns the task shim the executor starts at the tenant
// level. A --shim-path flag must name an absolute path of an executable
// regular file; without it, bashtask-shim in the directory of this binary
// when there is one (an error when it is not an executable regular file),
// else this binary itself (executor.DefaultShimPath), which is a shim too. A wrong build of the shim is refused later, by the
// executor's probe task: the shim's ready report names its protocol.
// checkLimits checks the flags that bound the agent's work and returns the
// output part size for agent.Config.PartBytes (-1: parts off), or an error
// naming the flag and its limit.
func (o *serveOptions) checkLimits() (partBytes int64, err error) {
	partBytes = o.partBytes
	switch {
	case partBytes == 0:
		partBytes = -1 // off
	case partBytes < agent.MinPartBytes:
		return 0, fmt.Errorf("--output-part-bytes %d: want 0 (no parts) or at least %d", o.partBytes, agent.MinPartBytes)
	}
	if o.partInterval < agent.MinPartInterval {
		return 0, fmt.Errorf("--output-part-interval %s: want at least %s", o.partInterval, agent.MinPartInterval)
	}
	if o.workspaceTimeout < 0 {
		return 0, fmt.Errorf("--shutdown-workspace-timeout %s: want 0 (move no workspace) or more", o.workspaceTimeout)
	}
	if o.shimPoolSize < 0 || o.shimPoolSize > maxShimPoolSize {
		return 0, fmt.Errorf("--shim-pool-size %d: want 0 (none) to %d", o.shimPoolSize, maxShimPoolSize)
	}
	if o.taskIdentity != "leased" && o.taskIdentity != "shared" {
		return 0, fmt.Errorf("--task-identity %q: want leased or shared", o.taskIdentity)
	}
	for _, p := range o.taskRunPaths {
		if err := shim.CheckRunPath(p); err != nil {
			return 0, fmt.Errorf("--task-run-paths: %w", err)
		}
	}
	return partBytes, nil
}

// diskQuota returns a task's default disk quota and the largest one a task
// may ask for, in bytes, from --task-disk-size and --task-disk-cap.
func (o *serveOptions) diskQuota() (size, capBytes int64, err error) {
	if size, err = parseBytes("--task-disk-size", o.taskDiskSize); err != nil {
		return 0, 0, err
	}
	if capBytes, err = parseBytes("--task-disk-cap", o.taskDiskCap); err != nil {
		return 0, 0, err
	}
	if size > 0 && capBytes < size {
		return 0, 0, fmt.Errorf("--task-disk-cap %s is below --task-disk-size %s", o.taskDiskCap, o.taskDiskSize)
	}
	return size, capBytes, nil
}

// tlsDirs returns the absolute directories of the agent's TLS files, which
// are hidden from tenant tasks whatever their mode (a Secret volume is
// world-readable by default). Mounts need absolute paths; the flags may be
// relative (bashtask-local passes paths under its --dir).
func (o *serveOptions) tlsDirs() ([]string, error) {
	var dirs []string
	for _, f := range []string{o.certFile, o.keyFile, o.caFile} {
		if f == "" {
			continue
		}
		dir, err := filepath.Abs(filepath.Dir(f))
		if err != nil {
			return nil, fmt.Errorf("the directory of %s: %w", f, err)
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

func resolveShimPath(flag string) (string, error) {
	usable := func(p string) error {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			return err
		case !fi.Mode().IsRegular():
			return errors.New("not a regular file")
		case fi.Mode().Perm()&0o111 == 0:
			return errors.New("not executable")
		}
		return nil
	}
	if flag != "" {
		if !filepath.IsAbs(flag) {
			return "", fmt.Errorf("--shim-path %q: want an absolute path", flag)
		}
		if err := usable(flag); err != nil {
			return "", fmt.Errorf("--shim-path %s: %w", flag, err)
		}
		return flag, nil
	}
	self, err := os.Executable()
	if err != nil {
		return executor.DefaultShimPath, nil
	}
	beside := filepath.Join(filepath.Dir(self), shimBinary)
	if _, err := os.Lstat(beside); err != nil {
		return executor.DefaultShimPath, nil
	}
	// One is there: a broken one is an installation fault, not a reason
	// to fall back quietly to the slower shim.
	if err := usable(beside); err != nil {
		return "", fmt.Errorf("%s beside the agent: %w (fix it, or name a shim with --shim-path)", beside, err)
	}
	return beside, nil
}

// parseUser reads "UID" or "UID:GID" (numeric; a bare UID uses the same
// number as GID).
func parseUser(s string) (*executor.User, error) {
	if s == "" {
		return nil, nil
	}
	us, gs, ok := strings.Cut(s, ":")
	if !ok {
		gs = us
	}
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--run-as-user %q: want numeric UID[:GID]", s)
	}
	gid, err := strconv.ParseUint(gs, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--run-as-user %q: want numeric UID[:GID]", s)
	}
	return &executor.User{UID: uint32(uid), GID: uint32(gid)}, nil
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", format)
	}
}

// parseBytes reads a flag's quantity (10Gi, 500M, 1073741824) as bytes.
func parseBytes(flag, v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a quantity such as 10Gi: %w", flag, v, err)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 {
		return 0, fmt.Errorf("%s %q: want a whole number of bytes, not negative", flag, v)
	}
	return n, nil
}
