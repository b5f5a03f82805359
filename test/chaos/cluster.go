package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// settings are the timings the cluster runs with.
type settings struct {
	leaseDuration, renewDeadline, retryPeriod time.Duration
	agentLostAfter                            time.Duration
	ownerLimit                                int
}

// agentNode is one agent with the proxy in front of it.
type agentNode struct {
	localcluster.Agent
	direct    string // the agent's own gRPC listener
	healthURL string
	stateDir  string
	proxy     *proxy
	proc      *proc
}

// controllerNode is one controller replica.
type controllerNode struct {
	proc       *proc
	metricsURL string
	healthURL  string
}

// cluster is the local cluster of a chaos run: etcd and kube-apiserver
// (envtest), versitygw, three agents behind proxies, two controllers with
// leader election.
type cluster struct {
	dir, binDir string
	set         settings
	log         func(format string, args ...any)

	cp          *localcluster.ControlPlane
	cs          *kubernetes.Clientset
	kubeconfig  string
	certs       *localcluster.Certs
	agents      []*agentNode
	controllers []*controllerNode
	s3          *proc
	s3Client    *s3.Client
	bucket      string
	apiserver   *proc // set once a fault restarted kube-apiserver
}

// locations of what the cluster needs.
type locations struct {
	binDir, assetsDir, crdDir, admissionDir string
}

func startCluster(ctx context.Context, dir string, loc locations, set settings, logf func(string, ...any)) (c *cluster, err error) {
	c = &cluster{dir: dir, binDir: loc.binDir, set: set, log: logf}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	for _, d := range []string{filepath.Join(dir, "logs"), filepath.Join(dir, "agents")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return c, err
		}
	}
	for _, bin := range []string{filepath.Join(loc.assetsDir, "kube-apiserver"), filepath.Join(loc.assetsDir, "etcd"),
		filepath.Join(loc.binDir, "bashtask-controller"), filepath.Join(loc.binDir, "bashtask-agent"), filepath.Join(loc.binDir, "versitygw")} {
		if _, err := os.Stat(bin); err != nil {
			return c, fmt.Errorf("%s is missing (run through `make test-chaos`, which builds it): %w", bin, err)
		}
	}
	logf("starting etcd and kube-apiserver from %s", loc.assetsDir)
	if c.cp, err = localcluster.StartControlPlane(ctx, loc.assetsDir, loc.crdDir, loc.admissionDir); err != nil {
		return c, err
	}
	if c.cs, err = kubernetes.NewForConfig(c.cp.Config); err != nil {
		return c, err
	}
	user, err := c.cp.Env.AddUser(envtest.User{Name: "chaos-admin", Groups: []string{"system:masters"}}, c.cp.Config)
	if err != nil {
		return c, fmt.Errorf("creating the administrator: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return c, err
	}
	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(c.kubeconfig, kc, 0o600); err != nil {
		return c, err
	}
	if c.certs, err = localcluster.IssueCerts(filepath.Join(dir, "certs"), localcluster.AgentServerName, 24*time.Hour); err != nil {
		return c, err
	}

	s3Env, err := c.startS3(ctx)
	if err != nil {
		return c, err
	}

	// Three agents at the process level for the plain tasks (their
	// commands write start records to the harness's directory), two at
	// the tenant level for the workspaces (workspaces.go).
	agents := localcluster.LoopbackAgents(processAgents + tenantAgents)
	for i := range agents {
		pool := "process"
		if i >= processAgents {
			pool = "tenant"
		}
		agents[i].Labels[poolLabel] = pool
	}
	proxyPort, err := localcluster.FreePort(agents[0].IP)
	if err != nil {
		return c, err
	}
	if err := localcluster.CreateAgentObjects(ctx, c.cp.Client, agents, proxyPort); err != nil {
		return c, err
	}
	for _, a := range agents {
		if err := c.startAgent(ctx, a, proxyPort, s3Env); err != nil {
			return c, err
		}
	}
	for i := range 2 {
		if err := c.startController(ctx, i); err != nil {
			return c, err
		}
	}
	if _, err := c.waitLeader(ctx, 60*time.Second); err != nil {
		return c, err
	}
	return c, nil
}

func freePorts(ip string, n int) ([]int, error) {
	var out []int
	for len(out) < n {
		p, err := localcluster.FreePort(ip)
		if err != nil {
			return nil, err
		}
		dup := false
		for _, q := range out {
			dup = dup || q == p
		}
		if !dup {
			out = append(out, p)
		}
	}
	return out, nil
}

func (c *cluster) startS3(ctx context.Context) ([]string, error) {
	root := filepath.Join(c.dir, "s3")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	port, err := localcluster.FreePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	access, secret := "chaos"+strconv.Itoa(os.Getpid()), "chaos-secret-"+strconv.FormatInt(time.Now().UnixNano(), 36)
	c.s3 = &proc{name: "versitygw", bin: filepath.Join(c.binDir, "versitygw"),
		args:    []string{"--port", addr, "--access", access, "--secret", secret, "--region", "us-east-1", "posix", root},
		env:     os.Environ(),
		logPath: filepath.Join(c.dir, "logs", "versitygw.log"), log: c.log}
	if err := startProc(c.s3); err != nil {
		return nil, err
	}
	c.s3Client = s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String("http://" + addr), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(access, secret, ""),
	})
	c.bucket = "bashtask-outputs"
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.s3Client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(c.bucket)})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("creating the outputs bucket in versitygw at %s: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return []string{
		"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1",
		"CHAOS_BUCKET_URL=s3://" + c.bucket + "?endpoint=http://" + addr + "&region=us-east-1&use_path_style=true",
	}, nil
}

// s3Ready reports whether the S3 server answers.
func (c *cluster) s3Ready(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.s3Client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(c.bucket)})
	return err == nil
}

func (c *cluster) startAgent(ctx context.Context, a localcluster.Agent, proxyPort int, s3Env []string) error {
	ports, err := freePorts(a.IP, 3)
	if err != nil {
		return err
	}
	for _, p := range ports {
		if p == proxyPort {
			return fmt.Errorf("port %d picked twice on %s; try again", p, a.IP)
		}
	}
	n := &agentNode{Agent: a,
		direct:    net.JoinHostPort(a.IP, strconv.Itoa(ports[0])),
		healthURL: "http://" + net.JoinHostPort(a.IP, strconv.Itoa(ports[1])) + "/readyz",
		stateDir:  filepath.Join(c.dir, "agents", a.Node),
	}
	bucketURL := ""
	var env []string
	for _, kv := range s3Env {
		if v, ok := strings.CutPrefix(kv, "CHAOS_BUCKET_URL="); ok {
			bucketURL = v
		} else {
			env = append(env, kv)
		}
	}
	n.proc = &proc{name: "agent-" + a.Node, bin: filepath.Join(c.binDir, "bashtask-agent"),
		args: []string{"serve",
			"--node-name", a.Node, "--pod-name", "bashtask-agent-" + a.Node,
			"--listen", n.direct,
			"--health-probe-address", net.JoinHostPort(a.IP, strconv.Itoa(ports[1])),
			"--metrics-address", net.JoinHostPort(a.IP, strconv.Itoa(ports[2])),
			"--state-dir", n.stateDir, "--output-bucket-url", bucketURL,
			"--tls-cert-file", c.certs.AgentCertFile, "--tls-key-file", c.certs.AgentKeyFile, "--tls-ca-file", c.certs.CAFile,
			// A parent cgroup per agent and run: an agent empties the
			// stale cgroups under its parent when it starts.
			"--cgroup-parent", fmt.Sprintf("bashtask-chaos-%d-%s", os.Getpid(), a.Node),
			"--progress-interval", "500ms", "--upload-backoff-initial", "500ms", "--upload-backoff-max", "5s",
			"--upload-timeout", "30s", "--log-format", "text",
		},
		env:     append(os.Environ(), env...),
		logPath: filepath.Join(c.dir, "logs", "agent-"+a.Node+".log"), log: c.log}
	if a.Labels[poolLabel] == "tenant" {
		// Workspaces: network Node for the beacon; a UID range and a
		// work root of its own, as two nodes would have.
		i := len(c.agents)
		n.proc.args = append(n.proc.args, "--isolation", "tenant", "--allowed-networks", "node,none,egress",
			"--task-network", "node", "--work-dir-root", filepath.Join(c.dir, "work", a.Node),
			"--task-uid-range", fmt.Sprintf("%d-%d", 2300000+10000*i, 2300000+10000*i+9999))
		if err := os.MkdirAll(filepath.Join(c.dir, "work", a.Node), 0o755); err != nil {
			return err
		}
	}
	if err := startProc(n.proc); err != nil {
		return err
	}
	c.agents = append(c.agents, n)
	if err := waitHTTP(ctx, n.healthURL, 60*time.Second); err != nil {
		return fmt.Errorf("agent %s: %w; see %s", a.Node, err, n.proc.logPath)
	}
	if n.proxy, err = newProxy(net.JoinHostPort(a.IP, strconv.Itoa(proxyPort)), n.direct); err != nil {
		return fmt.Errorf("proxy for agent %s: %w", a.Node, err)
	}
	return nil
}

func (c *cluster) startController(ctx context.Context, i int) error {
	ports, err := freePorts("127.0.0.1", 2)
	if err != nil {
		return err
	}
	n := &controllerNode{
		healthURL:  "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])) + "/readyz",
		metricsURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])) + "/metrics",
	}
	n.proc = &proc{name: fmt.Sprintf("controller-%d", i+1), bin: filepath.Join(c.binDir, "bashtask-controller"),
		args: []string{
			"--kubeconfig", c.kubeconfig,
			"--leader-elect=true", "--leader-election-namespace", localcluster.AgentNamespace,
			"--leader-election-lease-duration", c.set.leaseDuration.String(),
			"--leader-election-renew-deadline", c.set.renewDeadline.String(),
			"--leader-election-retry-period", c.set.retryPeriod.String(),
			"--agent-namespace", localcluster.AgentNamespace, "--agent-service", localcluster.AgentService, "--agent-port-name", localcluster.AgentPortName,
			"--tls-cert-file", c.certs.ControllerCertFile, "--tls-key-file", c.certs.ControllerKeyFile, "--tls-ca-file", c.certs.CAFile,
			"--health-probe-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			"--metrics-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
			"--agent-lost-after", c.set.agentLostAfter.String(),
			"--max-running-per-owner", strconv.Itoa(c.set.ownerLimit),
			"--orphan-check-interval", "10s", "--progress-interval", "1s", "--workers", "8",
			"--zap-log-level", "info",
		},
		env:     os.Environ(),
		logPath: filepath.Join(c.dir, "logs", n.procName(i)+".log"), log: c.log}
	if err := startProc(n.proc); err != nil {
		return err
	}
	c.controllers = append(c.controllers, n)
	return waitHTTP(ctx, n.healthURL, 60*time.Second)
}

func (n *controllerNode) procName(i int) string { return fmt.Sprintf("controller-%d", i+1) }

// leads reports whether the controller says it holds the lease. A stopped
// or dead controller does not answer and does not lead.
func (n *controllerNode) leads(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.metricsURL, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "leader_election_master_status{") && strings.HasSuffix(line, " 1") {
			return true
		}
	}
	return false
}

// leader returns the controller that leads now, or nil. While two say
// they lead (an old leader that has not yet noticed it lost the lease),
// neither is taken for the leader: the harness waits for one.
func (c *cluster) leader(ctx context.Context) *controllerNode {
	var leading []*controllerNode
	for _, n := range c.controllers {
		n.proc.mu.Lock()
		stopped := n.proc.stopped
		n.proc.mu.Unlock()
		if !stopped && n.leads(ctx) {
			leading = append(leading, n)
		}
	}
	if len(leading) != 1 {
		return nil
	}
	return leading[0]
}

// waitLeader waits until a controller leads.
func (c *cluster) waitLeader(ctx context.Context, timeout time.Duration) (*controllerNode, error) {
	deadline := time.Now().Add(timeout)
	for {
		if l := c.leader(ctx); l != nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no single controller leads after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s", url, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// apiReady reports whether kube-apiserver answers /readyz.
func (c *cluster) apiReady(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	return err == nil
}

// childByComm returns the pid of this process's child named comm.
func childByComm(comm string) (int, error) {
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

// killAPIServer kills kube-apiserver with SIGKILL and starts it again with
// the same command line restartAfter later. The first time, the process is
// envtest's; the harness then supervises the new one itself.
func (c *cluster) killAPIServer(restartAfter time.Duration) error {
	if c.apiserver != nil {
		return c.apiserver.kill(restartAfter)
	}
	pid, err := childByComm("kube-apiserver")
	if err != nil {
		return err
	}
	rawArgs, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return err
	}
	rawEnv, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return err
	}
	argv := strings.Split(strings.TrimRight(string(rawArgs), "\x00"), "\x00")
	env := strings.Split(strings.TrimRight(string(rawEnv), "\x00"), "\x00")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing kube-apiserver (pid %d): %w", pid, err)
	}
	// envtest's waiter reaps it; the port is free once it is gone.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver (pid %d) still there 10 s after SIGKILL", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(restartAfter)
	c.apiserver = &proc{name: "kube-apiserver", bin: argv[0], args: argv[1:], env: env,
		logPath: filepath.Join(c.dir, "logs", "kube-apiserver.log"), log: c.log}
	return startProc(c.apiserver)
}

// agentRecords returns the UIDs of the tasks the agent holds, read over
// mTLS with the controller's identity.
func (c *cluster) agentRecords(ctx context.Context, a *agentNode) ([]string, error) {
	tlsCfg, err := tlsutil.ClientConfig(c.certs.Controller, localcluster.AgentServerName)
	if err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient(a.direct, grpc.WithTransportCredentials(grpccreds.NewTLS(tlsCfg)))
	if err != nil {
		return nil, err
	}
	defer func() { _ = cc.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	resp, err := agentv1.NewExecutorClient(cc).List(ctx, &agentv1.ListRequest{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range resp.GetTasks() {
		out = append(out, t.GetRef().GetUid())
	}
	return out, nil
}

// recover ends every fault still in effect: resumes stopped processes and
// heals partitions.
func (c *cluster) recover() {
	var procs []*proc
	for _, n := range c.controllers {
		procs = append(procs, n.proc)
	}
	for _, a := range c.agents {
		procs = append(procs, a.proc)
		if a.proxy != nil {
			a.proxy.heal()
		}
	}
	procs = append(procs, c.s3)
	if c.apiserver != nil {
		procs = append(procs, c.apiserver)
	}
	for _, p := range procs {
		if p == nil {
			continue
		}
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if stopped {
			_ = p.signal(syscall.SIGCONT)
		}
	}
	if pid, err := childByComm("etcd"); err == nil {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// stop ends the controllers, the agents (which stop their tasks), the S3
// server and the control plane.
func (c *cluster) stop() {
	c.recover()
	for _, n := range c.controllers {
		n.proc.stop(15 * time.Second)
	}
	for _, a := range c.agents {
		if a.proxy != nil {
			a.proxy.close()
		}
		a.proc.stop(30 * time.Second)
	}
	if c.s3 != nil {
		c.s3.stop(10 * time.Second)
	}
	if c.apiserver != nil {
		c.apiserver.stop(15 * time.Second)
	}
	if c.cp != nil {
		if err := c.cp.Stop(); err != nil {
			c.log("stopping the control plane: %v", err)
		}
	}
}
