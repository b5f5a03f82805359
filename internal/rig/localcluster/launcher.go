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
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/mounts"
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
	// which the ambient-env scrub applies to like any other.
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
	// BucketURL is where agents upload output.
	BucketURL string
	// S3Env holds the AWS_* variables a client needs for BucketURL with S3.
	S3Env []string
	// OutputAPIPort is the controller's output.bashtask.dev port on
	// 127.0.0.1, which kube-apiserver's APIService proxies to.
	OutputAPIPort int
	// Isolation is the agents' isolation level, process or tenant.
	Isolation string

	opts  LauncherOptions
	lock  *os.File
	cp    *ControlPlane
	procs []*process // in start order
}

// process is one component the launcher supervises. Like a kubelet, the
// launcher starts it again when it exits while the cluster runs, so tests
// can kill a controller or an agent and watch it come back.
type process struct {
	name, bin string
	args, env []string
	logPath   string

	mu       sync.Mutex
	cmd      *exec.Cmd // the current run
	stopping bool
	restarts int

	firstExit chan struct{} // closed when the first run ends
	done      chan struct{} // closed when the supervisor returns
}

// ErrAlreadyRunning means another launcher holds the directory's lock.
var ErrAlreadyRunning = errors.New("a local cluster is already running in this directory")

// Up starts etcd and kube-apiserver, installs the CRDs, creates the agents'
// Nodes, Service and EndpointSlice, and starts the object store, the agents
// and the controller, waiting until each is ready. On error everything
// started so far is stopped. Call Down to stop the cluster.
//
// The controller, agents and object store are supervised: one that exits
// is started again, as a kubelet restarts a pod's container, and each gets
// SIGKILL if the launcher dies (PR_SET_PDEATHSIG), so a killed launcher
// leaves none of them behind.
func Up(ctx context.Context, o LauncherOptions) (*Cluster, error) {
	if o.Agents < 1 || o.Agents > 250 {
		return nil, fmt.Errorf("--agents must be between 1 and 250 (one loopback address each), got %d", o.Agents)
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
	c := &Cluster{opts: o, Kubeconfig: filepath.Join(o.Dir, "kubeconfig"), Isolation: isolation}
	var err error
	if c.lock, err = lockDir(o.Dir); err != nil {
		return nil, err
	}
	if err := c.up(ctx); err != nil {
		c.Down()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) up(ctx context.Context) error {
	o := c.opts
	for _, bin := range []string{filepath.Join(o.AssetsDir, "kube-apiserver"), filepath.Join(o.AssetsDir, "etcd"),
		filepath.Join(o.BinDir, "bashtask-controller"), filepath.Join(o.BinDir, "bashtask-agent")} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%s is missing (build it with `make build envtest`): %w", bin, err)
		}
	}

	o.Log.Info("Starting etcd and kube-apiserver", "assets", o.AssetsDir)
	certs, err := IssueCerts(filepath.Join(o.Dir, "certs"), AgentServerName, 30*24*time.Hour)
	if err != nil {
		return fmt.Errorf("issuing certificates: %w", err)
	}
	cp, err := StartControlPlaneWith(ctx, o.AssetsDir, o.CRDDir, o.AdmissionDir, certs)
	if err != nil {
		return err
	}
	c.cp = cp
	user, err := cp.Env.AddUser(envtest.User{Name: "bashtask-admin", Groups: []string{"system:masters"}}, cp.Config)
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
	k8s := cp.Client

	c.Agents = LoopbackAgents(o.Agents)
	port, err := FreePort(c.Agents[0].IP)
	if err != nil {
		return err
	}
	if err := CreateAgentObjects(ctx, k8s, c.Agents, port); err != nil {
		return err
	}

	var bucketEnv []string
	if o.S3 {
		if bucketEnv, err = c.startS3(ctx); err != nil {
			return err
		}
	}

	if !o.S3 {
		// One bucket directory for every agent, as one object store serves
		// a cluster. Temporary files go next to the objects, so fileblob's
		// rename stays on one file system.
		objects := absPath(filepath.Join(o.Dir, "objects"))
		if err := os.MkdirAll(objects, 0o700); err != nil {
			return err
		}
		c.BucketURL = "file://" + objects + "?no_tmp_dir=true"
	}
	// Agents on one host must not share what each assumes is its own: the
	// cgroup parent (a starting agent at the tenant level empties the
	// pooled shims' cgroups under it) and the task UIDs (two tasks with
	// one UID are one tenant). Each gets its own, derived from the
	// cluster's directory and the node, so two local clusters on one host
	// are apart too.
	tag := fnv.New32a()
	_, _ = tag.Write([]byte(absPath(o.Dir)))
	clusterTag := tag.Sum32()
	for i, a := range c.Agents {
		stateDir := absPath(filepath.Join(o.Dir, "agents", a.Node))
		// Working directories and workspaces of its own, beside (not in)
		// its state directory, which tasks do not see: the agents of one
		// host would otherwise share the system temporary directory.
		workRoot := absPath(filepath.Join(o.Dir, "work", a.Node))
		if err := os.MkdirAll(workRoot, 0o711); err != nil {
			return err
		}
		bucket := c.BucketURL
		args := []string{"serve",
			"--node-name", a.Node, "--pod-name", "bashtask-agent-" + a.Node,
			"--listen", net.JoinHostPort(a.IP, strconv.Itoa(port)),
			"--health-probe-address", net.JoinHostPort(a.IP, strconv.Itoa(port+1)),
			"--metrics-address", net.JoinHostPort(a.IP, strconv.Itoa(port+2)),
			"--pprof-address", net.JoinHostPort(a.IP, strconv.Itoa(port+3)),
			"--state-dir", stateDir, "--output-bucket-url", bucket,
			"--tls-cert-file", certs.AgentCertFile, "--tls-key-file", certs.AgentKeyFile, "--tls-ca-file", certs.CAFile,
			"--progress-interval", "500ms", "--log-format", "text",
			// Parts of 4 MiB or every 2 s: a task's output survives its
			// agent to within 2 s, and the e2e suite checks it quickly.
			"--output-part-bytes", "4194304", "--output-part-interval", "2s",
			"--work-dir-root", workRoot,
		}
		args = append(args, "--isolation="+c.Isolation,
			fmt.Sprintf("--cgroup-parent=bashtask-local-%08x-%s", clusterTag, a.Node),
			"--task-uid-range="+agentUIDRange(clusterTag, i))
		if c.Isolation == "tenant" {
			// Egress by default, as the chart's agents at this level (each
			// agent with a task range of its own: agents on one host share
			// its routing table). Node stays allowed, for a task that must
			// reach a service of the local cluster on the host's addresses
			// (the e2e suite's run counter), which Egress never reaches;
			// --agent-arg=--task-network=node makes it the default again.
			args = append(args, "--task-network=egress", "--allowed-networks=node,egress,none",
				"--egress-cidr="+agentEgressCIDR(clusterTag, i))
		}
		args = append(args, o.AgentArgs...)
		env := append(append(os.Environ(), bucketEnv...), o.AgentEnv...)
		if err := c.start("agent-"+a.Node, filepath.Join(o.BinDir, "bashtask-agent"), args, env); err != nil {
			return err
		}
		if err := c.waitHTTP(ctx, "agent "+a.Node, "http://"+net.JoinHostPort(a.IP, strconv.Itoa(port+1))+"/readyz"); err != nil {
			return err
		}
	}
	c.S3Env = bucketEnv

	ctrlHealth, err := FreePort("127.0.0.1")
	if err != nil {
		return err
	}
	ctrlMetrics, err := FreePort("127.0.0.1")
	if err != nil {
		return err
	}
	ctrlPprof, err := FreePort("127.0.0.1")
	if err != nil {
		return err
	}
	outputPort, err := FreePort("127.0.0.1")
	if err != nil {
		return err
	}
	c.OutputAPIPort = outputPort
	if err := CreateOutputAPIObjects(ctx, k8s, outputPort, certs); err != nil {
		return err
	}
	args := append([]string{
		"--kubeconfig", absPath(c.Kubeconfig),
		"--output-api-port", strconv.Itoa(outputPort), "--output-api-bind-address", "127.0.0.1",
		"--output-api-cert-dir", absPath(certs.OutputAPIDir), "--output-bucket-url", c.BucketURL,
		"--leader-elect=false",
		"--agent-namespace", AgentNamespace, "--agent-service", AgentService, "--agent-port-name", AgentPortName,
		"--tls-cert-file", certs.ControllerCertFile, "--tls-key-file", certs.ControllerKeyFile, "--tls-ca-file", certs.CAFile,
		"--health-probe-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ctrlHealth)),
		"--metrics-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ctrlMetrics)),
		"--pprof-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ctrlPprof)),
		"--zap-log-level", "info",
	}, o.ControllerArgs...)
	if err := c.start("controller", filepath.Join(o.BinDir, "bashtask-controller"), args, append(os.Environ(), bucketEnv...)); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "controller", "http://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(ctrlHealth))+"/readyz"); err != nil {
		return err
	}
	return WaitOutputAPI(ctx, cp.Config, 60*time.Second)
}

// startS3 runs versitygw with a posix backend on loopback, with credentials
// made for this run, and creates the outputs bucket.
func (c *Cluster) startS3(ctx context.Context) ([]string, error) {
	bin := filepath.Join(c.opts.BinDir, "versitygw")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s is missing (build it with hack/setup-s3.sh): %w", bin, err)
	}
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
	if err := c.start("versitygw", bin, []string{"--port", addr, "--access", access, "--secret", secret, "--region", "us-east-1", "posix", root},
		os.Environ()); err != nil {
		return nil, err
	}
	client := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String("http://" + addr), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(access, secret, ""),
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("bashtask-outputs")})
		if err == nil || strings.Contains(err.Error(), "BucketAlreadyOwnedByYou") || strings.Contains(err.Error(), "BucketAlreadyExists") {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("creating the outputs bucket in versitygw at %s: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.BucketURL = fmt.Sprintf("s3://bashtask-outputs?endpoint=http://%s&region=us-east-1&use_path_style=true", addr)
	return []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1"}, nil
}

// start runs a supervised child with its output appended to
// logs/<name>.log and its pid in pids/<name>. It returns once the first run
// started.
func (c *Cluster) start(name, bin string, args, env []string) error {
	p := &process{
		name: name, bin: bin, args: args, env: env,
		logPath:   filepath.Join(c.opts.Dir, "logs", name+".log"),
		firstExit: make(chan struct{}),
		done:      make(chan struct{}),
	}
	if err := os.MkdirAll(filepath.Join(c.opts.Dir, "pids"), 0o700); err != nil {
		return err
	}
	_ = os.Remove(p.logPath)
	started := make(chan error, 1)
	go c.supervise(p, started)
	if err := <-started; err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// supervise runs p until the cluster stops, restarting it after a second
// whenever it exits. It runs on an OS thread of its own, locked for its
// whole life, because PR_SET_PDEATHSIG ties each child to the thread that
// forked it: the child is killed when this goroutine (and so its thread)
// ends, or when the whole launcher dies.
func (c *Cluster) supervise(p *process, started chan<- error) {
	goruntime.LockOSThread()
	defer close(p.done)
	first := true
	for {
		cmd, err := p.run(c.opts.Dir)
		if first {
			started <- err
			first = false
			if err != nil {
				return
			}
			c.opts.Log.Info("Started", "component", p.name, "pid", cmd.Process.Pid, "log", p.logPath)
		} else if err != nil {
			c.opts.Log.Error("Restarting failed", "component", p.name, "err", err)
		} else {
			c.opts.Log.Warn("Restarted", "component", p.name, "pid", cmd.Process.Pid, "restarts", p.restarts)
		}
		if cmd != nil {
			werr := cmd.Wait()
			if f, ok := cmd.Stdout.(*os.File); ok {
				_ = f.Close()
			}
			select {
			case <-p.firstExit:
			default:
				close(p.firstExit)
			}
			p.mu.Lock()
			stopping := p.stopping
			p.mu.Unlock()
			if stopping {
				return
			}
			c.opts.Log.Warn("Exited; restarting in 1s", "component", p.name, "status", werr)
		}
		time.Sleep(time.Second)
		if p.held(c.opts.Dir) {
			return
		}
		p.mu.Lock()
		stopping := p.stopping
		p.restarts++
		p.mu.Unlock()
		if stopping {
			return
		}
	}
}

// HoldPath is the file that keeps a supervised component down once it
// exits: while hold/<name> exists under the cluster's directory, the
// launcher does not start it again, as for a node that is gone. Removing
// the file lets it start.
func HoldPath(dir, name string) string {
	return filepath.Join(dir, "hold", name)
}

// held waits while p's hold file exists; true when the cluster stops
// meanwhile.
func (p *process) held(dir string) bool {
	pidRemoved := false
	for {
		if _, err := os.Stat(HoldPath(dir, p.name)); err != nil {
			return false
		}
		if !pidRemoved {
			pidRemoved = true
			_ = os.Remove(filepath.Join(dir, "pids", p.name))
		}
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run starts one run of p.
func (p *process) run(dir string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", p.logPath, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own keeps a terminal's Ctrl-C from reaching
	// the child before the launcher stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		_ = logf.Close()
		return nil, errors.New("stopping")
	}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd = cmd
	_ = os.WriteFile(filepath.Join(dir, "pids", p.name), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	return cmd, nil
}

// stop ends p's supervision: SIGTERM, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) (killed bool) {
	p.mu.Lock()
	p.stopping = true
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
		return false
	case <-time.After(grace):
	}
	if cmd != nil {
		_ = cmd.Process.Kill()
	}
	<-p.done
	return true
}

// waitHTTP waits until url answers 200, or a child exits, or 60 s pass.
func (c *Cluster) waitHTTP(ctx context.Context, what, url string) error {
	deadline := time.Now().Add(60 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	last := c.procs[len(c.procs)-1]
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
		case <-last.firstExit:
			return fmt.Errorf("%s exited while starting; see %s", what, last.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 60 s at %s; see %s", what, url, last.logPath)
		}
	}
}

// Down stops the controller first, then the agents (which stop their
// tasks), the object store and the control plane, and releases the lock.
// Each child gets SIGTERM and, 15 s later, SIGKILL.
func (c *Cluster) Down() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if p.stop(15 * time.Second) {
			c.opts.Log.Warn("Did not stop in 15 s; killed", "component", p.name)
		}
		_ = os.Remove(filepath.Join(c.opts.Dir, "pids", p.name))
		c.opts.Log.Info("Stopped", "component", p.name)
	}
	c.procs = nil
	// The agents leave their workspaces' file systems mounted, as an
	// agent restart must find them; the cluster going down takes them
	// along (the images stay in the agents' state: the next up mounts
	// them again).
	if err := mounts.UnmountUnder(absPath(filepath.Join(c.opts.Dir, "work"))); err != nil {
		c.opts.Log.Error("Unmounting the workspaces", "err", err)
	}
	if c.cp != nil {
		if err := c.cp.Stop(); err != nil {
			c.opts.Log.Error("Stopping the control plane", "err", err)
		}
		c.cp = nil
	}
	if c.lock != nil {
		_ = os.Remove(filepath.Join(c.opts.Dir, "launcher.pid"))
		_ = c.lock.Close()
		c.lock = nil
	}
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
