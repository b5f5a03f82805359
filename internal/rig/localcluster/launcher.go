package localcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/mounts"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// LauncherOptions configure a local cluster.
type LauncherOptions struct {
	// Dir holds the lock, kubeconfig, certificates, logs and the agents'
	// state, normally .bashtask.
	Dir string
	// BinDir holds bashtask-controller, bashtask-agent and, with S3,
	// versitygw.
	BinDir string
	// AssetsDir holds kube-apiserver and etcd (hack/setup-envtest.sh).
	AssetsDir string
	// CRDDir holds the CRD manifests to install.
	CRDDir string
	// AdmissionDir holds the admission policies to install; empty installs
	// none.
	AdmissionDir string
	// Agents is the number of agents, each on a node of its own.
	Agents int
	// S3 stores output in a versitygw S3 server instead of a file:// bucket.
	S3 bool
	// AgentEnv are extra NAME=VALUE entries of the agents' environment,
	// which the agents' ambient-env mode applies to like any other.
	AgentEnv []string
	// Isolation is the agents' --isolation level: process or tenant (which
	// needs root). Empty means tenant when the launcher runs as root, as the
	// chart's default is, and process otherwise.
	Isolation string
	// AgentArgs are extra flags for every bashtask-agent; they come after
	// the launcher's own, so a flag given here wins.
	AgentArgs []string
	// ControllerArgs are extra flags for bashtask-controller.
	ControllerArgs []string
	// Controllers is the number of controller replicas; 0 means 1. With
	// more than one they elect a leader, as the chart's replicas do (the
	// chaos run kills and stops the leader).
	Controllers int
	// PerAgent, when set, is called for the i-th agent before its Node is
	// created: it may change the agent's labels, and returns flags for
	// that agent only, after AgentArgs (so they win). The chaos run gives
	// some agents the tenant level and others the process level this way.
	PerAgent func(i int, a *Agent) []string
	// AgentFront, when set, puts something of the caller's in front of
	// every agent: the agent listens on a port of its own, and AgentFront
	// is called once it is ready to listen on the address the
	// EndpointSlice lists and forward to the agent's. The chaos run
	// passes a TCP proxy it can cut, to partition an agent from the
	// controllers without touching the agent. Down closes what it returns.
	AgentFront func(a Agent, listen, agent string) (io.Closer, error)
	// AgentServer, when set, replaces every agent process: it is called
	// with the agent, the address its EndpointSlice entry lists and the
	// cluster's certificates, and serves the agent protocol there (the
	// scale benchmark's simulated agents, internal/rig/simagent). Down
	// closes what it returns.
	AgentServer func(a Agent, listen string, certs *Certs) (io.Closer, error)
	// Log receives progress messages.
	Log *slog.Logger
}

// uidsPerAgent is how many task UIDs each local agent leases from.
const uidsPerAgent = 4096

// agentUIDRange is the --task-uid-range of the index-th agent (fewer than
// 250) of the cluster tagged tag: uidsPerAgent UIDs from 2000000 (the
// agent's default range starts there) in one of 1000 slots per agent
// index, chosen by the tag, so agents of one cluster never overlap and
// two clusters on one host overlap with a probability of 1 in 1000. The
// highest UID is below 2000000 + 1000*250*4096, about 1.03e9.
func agentUIDRange(tag uint32, index int) string {
	first := 2000000 + (uint64(tag%1000)*250+uint64(index))*uidsPerAgent
	return fmt.Sprintf("%d-%d", first, first+uidsPerAgent-1)
}

// agentEgressCIDR is the task range of the index-th agent of the cluster
// tagged tag: a /20 of 100.64.0.0/10 (1024 tasks at once). Agents on one
// host share its routing table, so their task ranges must not overlap.
func agentEgressCIDR(tag uint32, index int) string {
	block := (tag%1000*8 + uint32(index)) % 1024
	return fmt.Sprintf("100.%d.%d.0/20", 64+block>>4, (block&15)<<4)
}

// Cluster is a running local cluster.
type Cluster struct {
	// Kubeconfig is the path of an administrator's kubeconfig.
	Kubeconfig string
	// Agents are the agents and their nodes.
	Agents []Agent
	// AgentProcesses are the running agents, in the order of Agents.
	AgentProcesses []*AgentProcess
	// Controllers are the controller replicas, in start order.
	Controllers []*ControllerProcess
	// ObjectStore is versitygw with S3, nil with a file:// bucket.
	ObjectStore *Process
	// BucketURL is where agents upload output.
	BucketURL string
	// S3Env holds the AWS_* variables a client needs for BucketURL with S3.
	S3Env []string
	// S3Endpoint is versitygw's http:// address with S3, and S3Bucket the
	// outputs bucket in it.
	S3Endpoint, S3Bucket string
	// OutputAPIPort is the controller's output.bashtask.dev port on
	// 127.0.0.1, which kube-apiserver's APIService proxies to.
	OutputAPIPort int
	// Isolation is the agents' isolation level, process or tenant.
	Isolation string

	opts  LauncherOptions
	lock  *os.File
	cp    *ControlPlane
	certs *Certs
	steps *steps
}

// AgentProcess is one running agent of a cluster.
type AgentProcess struct {
	Agent
	// Addr is the agent's own gRPC listener. Without a front it is the
	// address the EndpointSlice lists; with LauncherOptions.AgentFront,
	// the front listens there instead and forwards here.
	Addr string
	// HealthURL is the agent's /readyz.
	HealthURL string
	// MetricsURL is the agent's /metrics.
	MetricsURL string
	// StateDir is the agent's --state-dir.
	StateDir string
	// Process is the supervised agent.
	Process *Process
	// Front is what AgentFront returned, nil without one.
	Front io.Closer

	args []string // PerAgent's flags
}

// ControllerProcess is one running controller replica.
type ControllerProcess struct {
	// HealthURL is the controller's /readyz.
	HealthURL string
	// MetricsURL is the controller's /metrics, which says whether it leads
	// (leader_election_master_status).
	MetricsURL string
	// OutputAPIPort is its output.bashtask.dev port on 127.0.0.1.
	OutputAPIPort int
	// Process is the supervised controller.
	Process *Process
}

// ErrAlreadyRunning means another launcher holds the directory's lock.
var ErrAlreadyRunning = errors.New("a local cluster is already running in this directory")

// Up starts etcd and kube-apiserver, installs the CRDs, creates the agents'
// Nodes, Service and EndpointSlice, and starts the object store, the agents
// and the controller, waiting until each is ready. The start-up is the
// ordered list of named steps of Steps; an error names its step (a
// *StepError), and on error every step that ran is undone in reverse
// order. Call Down to stop the cluster, which undoes them all.
//
// The controller, agents and object store are supervised: one that exits
// is started again, as a kubelet restarts a pod's container, and each gets
// SIGKILL if the launcher dies (PR_SET_PDEATHSIG), so a killed launcher
// leaves none of them behind.
func Up(ctx context.Context, o LauncherOptions) (*Cluster, error) {
	if o.Agents < 1 || o.Agents > 250 {
		return nil, fmt.Errorf("--agents must be between 1 and 250 (one loopback address each), got %d", o.Agents)
	}
	if o.Controllers < 0 || o.Controllers > 9 {
		return nil, fmt.Errorf("controllers must be between 1 and 9, got %d", o.Controllers)
	}
	if o.Controllers == 0 {
		o.Controllers = 1
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	isolation := o.Isolation
	switch {
	case isolation == "" && os.Geteuid() == 0:
		isolation = "tenant"
	case isolation == "":
		isolation = "process"
	case isolation != "process" && isolation != "tenant":
		return nil, fmt.Errorf("--isolation must be process or tenant, got %q", isolation)
	}
	for _, d := range []string{o.Dir, filepath.Join(o.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	c := &Cluster{opts: o, Kubeconfig: filepath.Join(o.Dir, "kubeconfig"), Isolation: isolation,
		steps: &steps{log: o.Log, dir: o.Dir}}
	// A new record per run: changes.log describes this launcher's changes.
	_ = os.Remove(filepath.Join(o.Dir, "changes.log"))
	for _, s := range c.Steps() {
		if err := c.steps.run(ctx, s); err != nil {
			if uerr := c.steps.undo(); uerr != nil {
				err = errors.Join(err, uerr)
			}
			return nil, err
		}
	}
	return c, nil
}

// Steps returns the start-up's steps in order; Up runs them. They are
// built once the options are known: one per agent and per controller.
//
//	check-binaries      the binaries exist (nothing to undo)
//	lock                the directory's launcher lock (undo: release it)
//	certificates        the CA and every component's certificate
//	control-plane       etcd and kube-apiserver with the CRDs (undo: stop them)
//	kubeconfig          the administrator's kubeconfig
//	agent-objects       the agents' Nodes, Service and EndpointSlice
//	object-store        versitygw and its bucket, or a file:// bucket (undo: stop versitygw)
//	workspace-mounts    the agents' work roots (undo: unmount what the agents left mounted)
//	agent <node>        one agent, ready (undo: stop its front and the agent)
//	output-api-objects  the APIService and its Service for output.bashtask.dev
//	controller[-<n>]    one controller replica, ready (undo: stop it)
//	output-api          wait until the APIService is available
func (c *Cluster) Steps() []Step {
	o := c.opts
	var agentPort int
	out := []Step{
		{Name: "check-binaries", Do: func(context.Context) error { return c.checkBinaries() }},
		{Name: "lock", Do: func(context.Context) error {
			lock, err := lockDir(o.Dir)
			if err != nil {
				return err
			}
			c.lock = lock
			c.steps.record("", "lock", filepath.Join(o.Dir, "launcher.lock")+" and launcher.pid "+strconv.Itoa(os.Getpid()), 0)
			return nil
		}, Undo: func() error {
			if c.lock == nil {
				return nil
			}
			_ = os.Remove(filepath.Join(o.Dir, "launcher.pid"))
			err := c.lock.Close()
			c.lock = nil
			return err
		}},
		{Name: "certificates", Do: func(context.Context) error {
			certs, err := IssueCerts(filepath.Join(o.Dir, "certs"), AgentServerName, 30*24*time.Hour)
			if err != nil {
				return fmt.Errorf("issuing certificates: %w", err)
			}
			c.certs = certs
			return nil
		}},
		{Name: "control-plane", Do: c.startControlPlane, Undo: func() error {
			if c.cp == nil {
				return nil
			}
			err := c.cp.Stop()
			c.cp = nil
			return err
		}},
		{Name: "kubeconfig", Do: c.writeKubeconfig},
		{Name: "agent-objects", Do: func(ctx context.Context) error {
			c.Agents = LoopbackAgents(o.Agents)
			for i := range c.Agents {
				if o.PerAgent != nil {
					// Called here, before the Nodes exist, so that the
					// hook's labels are on them; its flags are kept for
					// the agent's step.
					c.AgentProcesses = append(c.AgentProcesses, &AgentProcess{})
					c.AgentProcesses[i].args = o.PerAgent(i, &c.Agents[i])
				} else {
					c.AgentProcesses = append(c.AgentProcesses, &AgentProcess{})
				}
				c.AgentProcesses[i].Agent = c.Agents[i]
			}
			port, err := FreePort(c.Agents[0].IP)
			if err != nil {
				return err
			}
			agentPort = port
			return CreateAgentObjects(ctx, c.cp.Client, c.Agents, port)
		}},
		{Name: "object-store", Do: c.startObjectStore, Undo: func() error {
			if c.ObjectStore != nil {
				c.stopProcess(c.ObjectStore)
			}
			return nil
		}},
		{Name: "workspace-mounts", Do: func(context.Context) error {
			return os.MkdirAll(absPath(filepath.Join(o.Dir, "work")), 0o711)
		}, Undo: func() error {
			// The agents leave their workspaces' file systems mounted, as
			// an agent restart must find them; the cluster going down
			// takes them along (the images stay in the agents' state:
			// the next up mounts them again).
			return mounts.UnmountUnder(absPath(filepath.Join(o.Dir, "work")))
		}},
	}
	for i := range o.Agents {
		name := fmt.Sprintf("agent node-%d", i+1)
		out = append(out, Step{Name: name,
			Do: func(ctx context.Context) error { return c.startAgent(ctx, i, agentPort) },
			Undo: func() error {
				if i >= len(c.AgentProcesses) {
					return nil
				}
				a := c.AgentProcesses[i]
				var err error
				if a.Front != nil {
					err = a.Front.Close()
				}
				if a.Process != nil {
					c.stopProcess(a.Process)
				}
				return err
			}})
	}
	out = append(out, Step{Name: "output-api-objects", Do: func(ctx context.Context) error {
		port, err := FreePort("127.0.0.1")
		if err != nil {
			return err
		}
		c.OutputAPIPort = port
		return CreateOutputAPIObjects(ctx, c.cp.Client, port, c.certs)
	}})
	for i := range o.Controllers {
		out = append(out, Step{Name: c.controllerName(i),
			Do: func(ctx context.Context) error { return c.startController(ctx, i) },
			Undo: func() error {
				if i < len(c.Controllers) && c.Controllers[i].Process != nil {
					c.stopProcess(c.Controllers[i].Process)
				}
				return nil
			}})
	}
	out = append(out, Step{Name: "output-api", Do: func(ctx context.Context) error {
		return WaitOutputAPI(ctx, c.cp.Config, 60*time.Second)
	}})
	return out
}

func (c *Cluster) checkBinaries() error {
	o := c.opts
	for _, bin := range []string{filepath.Join(o.AssetsDir, "kube-apiserver"), filepath.Join(o.AssetsDir, "etcd"),
		filepath.Join(o.BinDir, "bashtask-controller"), filepath.Join(o.BinDir, "bashtask-agent")} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%s is missing (build it with `make build envtest`): %w", bin, err)
		}
	}
	if o.S3 {
		if bin := filepath.Join(o.BinDir, "versitygw"); !fileExists(bin) {
			return fmt.Errorf("%s is missing (build it with hack/setup-s3.sh)", bin)
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	c.opts.Log.Info("Starting etcd and kube-apiserver", "assets", c.opts.AssetsDir)
	cp, err := StartControlPlaneWith(ctx, c.opts.AssetsDir, c.opts.CRDDir, c.opts.AdmissionDir, c.certs)
	if err != nil {
		return err
	}
	c.cp = cp
	// envtest starts them; their pids are recorded all the same, as every
	// process this launcher caused.
	for _, comm := range []string{"etcd", "kube-apiserver"} {
		if pid, err := ChildPID(comm); err == nil {
			c.steps.record("", "pid", comm, pid)
		}
	}
	return nil
}

func (c *Cluster) writeKubeconfig(context.Context) error {
	user, err := c.cp.Env.AddUser(envtest.User{Name: "bashtask-admin", Groups: []string{"system:masters"}}, c.cp.Config)
	if err != nil {
		return fmt.Errorf("creating the administrator: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.Kubeconfig, kubeconfig, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	return nil
}

func (c *Cluster) startObjectStore(ctx context.Context) error {
	if c.opts.S3 {
		env, err := c.startS3(ctx)
		if err != nil {
			return err
		}
		c.S3Env = env
		return nil
	}
	// One bucket directory for every agent, as one object store serves a
	// cluster. Temporary files go next to the objects, so fileblob's
	// rename stays on one file system.
	objects := absPath(filepath.Join(c.opts.Dir, "objects"))
	if err := os.MkdirAll(objects, 0o700); err != nil {
		return err
	}
	c.BucketURL = "file://" + objects + "?no_tmp_dir=true"
	return nil
}

// clusterTag tells this cluster's host-wide names (cgroup parents, UID
// ranges, egress ranges) from another local cluster's on the same host: it
// is derived from the cluster's directory.
func (c *Cluster) clusterTag() uint32 {
	tag := fnv.New32a()
	_, _ = tag.Write([]byte(absPath(c.opts.Dir)))
	return tag.Sum32()
}

// startAgent starts the i-th agent and waits until it is ready. Agents on
// one host must not share what each assumes is its own: the cgroup parent
// (a starting agent at the tenant level empties the pooled shims' cgroups
// under it) and the task UIDs (two tasks with one UID are one tenant).
// Each gets its own, derived from the cluster's directory and the node, so
// two local clusters on one host are apart too.
func (c *Cluster) startAgent(ctx context.Context, i, servicePort int) error {
	o := c.opts
	ap := c.AgentProcesses[i]
	a := ap.Agent
	if o.AgentServer != nil {
		ap.Addr = net.JoinHostPort(a.IP, strconv.Itoa(servicePort))
		srv, err := o.AgentServer(a, ap.Addr, c.certs)
		if err != nil {
			return fmt.Errorf("the simulated agent of %s: %w", a.Node, err)
		}
		ap.Front = srv
		return nil
	}
	// Without a front the agent listens on the EndpointSlice's port;
	// with one, on a port of its own behind it.
	port := servicePort
	if o.AgentFront != nil {
		var err error
		if port, err = freePortApart(a.IP, servicePort); err != nil {
			return err
		}
	}
	ap.Addr = net.JoinHostPort(a.IP, strconv.Itoa(port))
	ap.HealthURL = "http://" + net.JoinHostPort(a.IP, strconv.Itoa(port+1)) + "/readyz"
	ap.MetricsURL = "http://" + net.JoinHostPort(a.IP, strconv.Itoa(port+2)) + "/metrics"
	ap.StateDir = absPath(filepath.Join(o.Dir, "agents", a.Node))
	// Working directories and workspaces of its own, beside (not in) its
	// state directory, which tasks do not see: the agents of one host
	// would otherwise share the system temporary directory.
	workRoot := absPath(filepath.Join(o.Dir, "work", a.Node))
	if err := os.MkdirAll(workRoot, 0o711); err != nil {
		return err
	}
	tag := c.clusterTag()
	cgroupParent := fmt.Sprintf("bashtask-local-%08x-%s", tag, a.Node)
	uids := agentUIDRange(tag, i)
	args := []string{"serve",
		"--node-name", a.Node, "--pod-name", "bashtask-agent-" + a.Node,
		"--listen", ap.Addr,
		"--health-probe-address", net.JoinHostPort(a.IP, strconv.Itoa(port+1)),
		"--metrics-address", net.JoinHostPort(a.IP, strconv.Itoa(port+2)),
		"--pprof-address", net.JoinHostPort(a.IP, strconv.Itoa(port+3)),
		"--state-dir", ap.StateDir, "--output-bucket-url", c.BucketURL,
		"--tls-cert-file", c.certs.AgentCertFile, "--tls-key-file", c.certs.AgentKeyFile, "--tls-ca-file", c.certs.CAFile,
		"--progress-interval", "500ms", "--log-format", "text",
		// Parts of 4 MiB or every 2 s: a task's output survives its agent
		// to within 2 s, and the e2e suite checks it quickly.
		"--output-part-bytes", "4194304", "--output-part-interval", "2s",
		"--work-dir-root", workRoot,
		"--isolation=" + c.Isolation, "--cgroup-parent=" + cgroupParent, "--task-uid-range=" + uids,
	}
	// Host settings the agent makes from these flags, recorded as the
	// launcher's: it chose them.
	c.steps.record("", "setting", "cgroup parent "+cgroupParent+" (made by agent "+a.Node+")", 0)
	c.steps.record("", "setting", "task UIDs "+uids+" (leased by agent "+a.Node+")", 0)
	c.steps.record("", "setting", "mounts under "+workRoot+" (made by agent "+a.Node+", unmounted by workspace-mounts)", 0)
	if c.Isolation == "tenant" {
		// Egress by default, as the chart's agents at this level (each
		// agent with a task range of its own: agents on one host share its
		// routing table). Node stays allowed, for a task that must reach a
		// service of the local cluster on the host's addresses (the e2e
		// suite's run counter), which Egress never reaches;
		// --agent-arg=--task-network=node makes it the default again.
		cidr := agentEgressCIDR(tag, i)
		args = append(args, "--task-network=egress", "--allowed-networks=node,egress,none", "--egress-cidr="+cidr)
		c.steps.record("", "setting", "egress range "+cidr+" routes and nftables rules (made by agent "+a.Node+")", 0)
	}
	args = append(args, o.AgentArgs...)
	args = append(args, ap.args...)
	env := append(append(agentEnviron(os.Getenv), c.S3Env...), o.AgentEnv...)
	p, err := c.startProcess("agent-"+a.Node, filepath.Join(o.BinDir, "bashtask-agent"), args, env)
	if err != nil {
		return err
	}
	ap.Process = p
	if err := c.waitHTTP(ctx, "agent "+a.Node, ap.HealthURL, p); err != nil {
		return err
	}
	if o.AgentFront != nil {
		front, err := o.AgentFront(a, net.JoinHostPort(a.IP, strconv.Itoa(servicePort)), ap.Addr)
		if err != nil {
			return fmt.Errorf("the front of agent %s: %w", a.Node, err)
		}
		ap.Front = front
	}
	return nil
}

// freePortApart returns a free port on ip whose next three (the agents'
// health, metrics and pprof ports) do not include avoid.
func freePortApart(ip string, avoid int) (int, error) {
	for range 20 {
		p, err := FreePort(ip)
		if err != nil {
			return 0, err
		}
		if p != avoid && (avoid < p || avoid > p+3) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port on %s apart from %d", ip, avoid)
}

func (c *Cluster) controllerName(i int) string {
	if c.opts.Controllers <= 1 {
		return "controller"
	}
	return fmt.Sprintf("controller-%d", i+1)
}

// startController starts the i-th controller replica and waits until it
// is ready. With more than one replica they elect a leader, as the chart's
// replicas do; each serves the output API on a port of its own (the
// APIService reaches the first).
func (c *Cluster) startController(ctx context.Context, i int) error {
	o := c.opts
	var ports [3]int
	for k := range ports {
		p, err := FreePort("127.0.0.1")
		if err != nil {
			return err
		}
		ports[k] = p
	}
	outputPort := c.OutputAPIPort
	if i > 0 {
		p, err := FreePort("127.0.0.1")
		if err != nil {
			return err
		}
		outputPort = p
	}
	cp := &ControllerProcess{
		HealthURL:     "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])) + "/readyz",
		MetricsURL:    "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])) + "/metrics",
		OutputAPIPort: outputPort,
	}
	leaderElect := []string{"--leader-elect=false"}
	if o.Controllers > 1 {
		leaderElect = []string{"--leader-elect=true", "--leader-election-namespace", AgentNamespace}
	}
	args := append([]string{
		"--kubeconfig", absPath(c.Kubeconfig),
		"--output-api-port", strconv.Itoa(outputPort), "--output-api-bind-address", "127.0.0.1",
		"--output-api-cert-dir", absPath(c.certs.OutputAPIDir), "--output-bucket-url", c.BucketURL,
		"--agent-namespace", AgentNamespace, "--agent-service", AgentService, "--agent-port-name", AgentPortName,
		"--tls-cert-file", c.certs.ControllerCertFile, "--tls-key-file", c.certs.ControllerKeyFile, "--tls-ca-file", c.certs.CAFile,
		"--health-probe-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		"--metrics-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		"--pprof-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2])),
		"--zap-log-level", "info",
	}, leaderElect...)
	args = append(args, o.ControllerArgs...)
	p, err := c.startProcess(c.controllerName(i), filepath.Join(o.BinDir, "bashtask-controller"), args, append(os.Environ(), c.S3Env...))
	if err != nil {
		return err
	}
	cp.Process = p
	c.Controllers = append(c.Controllers, cp)
	return c.waitHTTP(ctx, c.controllerName(i), cp.HealthURL, p)
}

// startS3 runs versitygw with a posix backend on loopback, with credentials
// made for this run, and creates the outputs bucket.
func (c *Cluster) startS3(ctx context.Context) ([]string, error) {
	bin := filepath.Join(c.opts.BinDir, "versitygw")
	root := filepath.Join(c.opts.Dir, "s3")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	port, err := FreePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	access, secret := "local"+randomHex(6), randomHex(20)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p, err := c.startProcess("versitygw", bin, []string{"--port", addr, "--access", access, "--secret", secret, "--region", "us-east-1", "posix", root},
		os.Environ())
	if err != nil {
		return nil, err
	}
	c.ObjectStore = p
	c.S3Endpoint, c.S3Bucket = "http://"+addr, "bashtask-outputs"
	env := []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1"}
	client := newS3Client(c.S3Endpoint, access, secret)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(c.S3Bucket)})
		if err == nil || BucketExists(err) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("creating the outputs bucket in versitygw at %s: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	c.BucketURL = fmt.Sprintf("s3://%s?endpoint=http://%s&region=us-east-1&use_path_style=true", c.S3Bucket, addr)
	return env, nil
}

func newS3Client(endpoint, access, secret string) *s3.Client {
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(access, secret, ""),
	})
}

// S3Client returns a client of the cluster's versitygw with its
// credentials, nil without S3.
func (c *Cluster) S3Client() *s3.Client {
	if c.S3Endpoint == "" {
		return nil
	}
	var access, secret string
	for _, kv := range c.S3Env {
		if v, ok := strings.CutPrefix(kv, "AWS_ACCESS_KEY_ID="); ok {
			access = v
		} else if v, ok := strings.CutPrefix(kv, "AWS_SECRET_ACCESS_KEY="); ok {
			secret = v
		}
	}
	return newS3Client(c.S3Endpoint, access, secret)
}

// BucketExists reports whether err says the bucket to create exists
// already, which for the launcher means the bucket is there: versitygw
// keeps its buckets across a restart of its own. Matched by the S3 error's
// type and code, not by its message, which servers word differently.
func BucketExists(err error) bool {
	var owned *s3types.BucketAlreadyOwnedByYou
	var exists *s3types.BucketAlreadyExists
	if errors.As(err, &owned) || errors.As(err, &exists) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "BucketAlreadyOwnedByYou", "BucketAlreadyExists":
			return true
		}
	}
	return false
}

// ControlPlane returns the cluster's etcd and kube-apiserver.
func (c *Cluster) ControlPlane() *ControlPlane { return c.cp }

// Certs returns the cluster's certificates.
func (c *Cluster) Certs() *Certs { return c.certs }

// Changes returns every change to the host recorded so far: processes
// started (each run) and host settings, in order.
func (c *Cluster) Changes() []Change {
	c.steps.mu.Lock()
	defer c.steps.mu.Unlock()
	return append([]Change(nil), c.steps.changes...)
}

// StepsDone returns the names of the steps that ran (and that Down will
// undo), in order.
func (c *Cluster) StepsDone() []string { return c.steps.names() }

// startProcess starts a supervised component, recording each run's pid.
func (c *Cluster) startProcess(name, bin string, args, env []string) (*Process, error) {
	step := ""
	p := &Process{
		name: name, bin: bin, args: args, env: env,
		logPath: filepath.Join(c.opts.Dir, "logs", name+".log"),
		dir:     c.opts.Dir,
		log:     c.opts.Log.Info,
		recordPID: func(name string, pid int) {
			c.steps.record(step, "pid", name, pid)
		},
	}
	c.steps.mu.Lock()
	step = c.steps.current
	if step == "" {
		step = "supervise " + name
	}
	c.steps.mu.Unlock()
	_ = os.Remove(p.logPath)
	if err := startProcess(p); err != nil {
		return nil, err
	}
	return p, nil
}

// Supervise starts a component of the caller's (the chaos run restarts
// kube-apiserver this way after killing envtest's) under the cluster's
// supervision: restarted when it exits, its pid recorded, and stopped by
// Down before the steps of the start-up are undone.
func (c *Cluster) Supervise(name, bin string, args, env []string) (*Process, error) {
	p, err := c.startProcess(name, bin, args, env)
	if err != nil {
		return nil, err
	}
	c.steps.add(Step{Name: "supervise " + name, Undo: func() error {
		c.stopProcess(p)
		return nil
	}})
	return p, nil
}

// stopGrace is how long a process of the cluster gets after SIGTERM before
// SIGKILL: long enough for an agent's drain without a controller (10 s).
const stopGrace = 15 * time.Second

// stopProcess stops p: SIGTERM, then SIGKILL after stopGrace.
func (c *Cluster) stopProcess(p *Process) {
	grace := stopGrace
	if p.stop(grace) {
		c.opts.Log.Warn("Did not stop in time; killed", "component", p.name, "grace", grace)
	}
	_ = os.Remove(filepath.Join(c.opts.Dir, "pids", p.name))
	c.opts.Log.Info("Stopped", "component", p.name)
}

// waitHTTP waits until url answers 200, or p's first run exits, or 60 s
// pass.
func (c *Cluster) waitHTTP(ctx context.Context, what, url string, p *Process) error {
	deadline := time.Now().Add(60 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.firstExit:
			return fmt.Errorf("%s exited while starting; see %s", what, p.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 60 s at %s; see %s", what, url, p.logPath)
		}
	}
}

// Down stops the controller first, then the agents (which stop their
// tasks), the object store and the control plane, and releases the lock:
// the start-up's steps undone in reverse order. Each child gets SIGTERM
// and, 15 s later, SIGKILL. Errors are logged; Close returns them.
func (c *Cluster) Down() {
	_ = c.Close()
}

// Close is Down returning the undo errors, each naming its step.
func (c *Cluster) Close() error {
	return c.steps.undo()
}

// ChildPID returns the pid of this process's child whose command name
// (/proc/<pid>/comm) is comm, such as envtest's "etcd": what the chaos run
// signals, and what the launcher records for processes envtest started.
func ChildPID(comm string) (int, error) {
	for _, pid := range procfs.PIDs() {
		st, err := procfs.ReadStat(pid)
		if err != nil || st.PPID != os.Getpid() {
			continue
		}
		name, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if strings.TrimSpace(string(name)) == comm {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no %s child of pid %d", comm, os.Getpid())
}

// lockDir takes the directory's launcher lock and records this process's
// pid, or returns ErrAlreadyRunning naming the holder.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "launcher.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		pid, _ := os.ReadFile(filepath.Join(dir, "launcher.pid"))
		return nil, fmt.Errorf("%w (pid %s, kubeconfig %s); stop it with Ctrl-C or `bashtask-local down`",
			ErrAlreadyRunning, strings.TrimSpace(string(pid)), filepath.Join(dir, "kubeconfig"))
	}
	if err := os.WriteFile(filepath.Join(dir, "launcher.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// Signal sends sig to the launcher running in dir, for `down`. It returns
// an error when none runs.
func Signal(dir string, sig syscall.Signal) (int, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "launcher.pid"))
	if err != nil {
		return 0, fmt.Errorf("no local cluster runs in %s: %w", dir, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", filepath.Join(dir, "launcher.pid"), err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return pid, fmt.Errorf("signalling the launcher (pid %d): %w", pid, err)
	}
	return pid, nil
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// WaitAcceptsTasks waits until the API server accepts a BashTask create,
// tried as a server-side dry run so nothing is stored. Right after the CRD is
// installed, creates fail with 503 for a few seconds while the admission
// policies' view of the new kind catches up; a cluster that says it is up
// must accept tasks at once.
func WaitAcceptsTasks(ctx context.Context, c client.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		probe := &bashtaskv1alpha1.BashTask{}
		probe.GenerateName, probe.Namespace = "readiness-", "default"
		probe.Spec.Command = "true"
		err := c.Create(ctx, probe, client.DryRunAll)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server does not accept BashTasks %s after the CRD was installed: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WriteLogTails writes the last lines of every component's log under dir
// (a cluster directory, as Options.Dir) to w, each under a header naming
// the file: what to read first when a run against the cluster failed.
func WriteLogTails(w io.Writer, dir string, lines int) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		ls := strings.Split(string(data), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		fmt.Fprintf(w, "==== %s (last lines)\n%s\n", l, strings.Join(ls, "\n"))
	}
}

// agentEnvNames are the variables of the launcher's environment an agent
// gets: what a DaemonSet's container has (PATH, HOME) and what a Go
// program's test run sets for its children (TMPDIR, coverage and race
// settings). Nothing else of the shell that started the launcher reaches
// an agent, and so no task: a local run previews a cluster's.
var agentEnvNames = []string{"PATH", "HOME", "TMPDIR", "GOCOVERDIR", "GORACE", "GOTRACEBACK"}

// agentEnviron is an agent's base environment, the agentEnvNames that
// getenv has.
func agentEnviron(getenv func(string) string) []string {
	var env []string
	for _, name := range agentEnvNames {
		if v := getenv(name); v != "" {
			env = append(env, name+"="+v)
		}
	}
	return env
}
