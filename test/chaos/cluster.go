package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"k8s.io/client-go/kubernetes"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor/agent"
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
	*localcluster.AgentProcess
	proxy *proxy
}

// controllerNode is one controller replica.
type controllerNode struct {
	*localcluster.ControllerProcess
}

// cluster is the local cluster of a chaos run, started by localcluster's
// launcher (the one bashtask-local and the e2e suite use): etcd and
// kube-apiserver (envtest), versitygw, five agents behind proxies, two
// controllers with leader election. What is the chaos run's own is passed
// to the launcher as hooks: the proxies (AgentFront), the agents' levels
// and pools (PerAgent), the timings (flags).
type cluster struct {
	*localcluster.Cluster
	dir string
	set settings
	log func(format string, args ...any)

	cp          *localcluster.ControlPlane
	cs          *kubernetes.Clientset
	certs       *localcluster.Certs
	agents      []*agentNode
	controllers []*controllerNode
	s3          *localcluster.Process
	s3Client    *s3.Client
	bucket      string

	mu        sync.Mutex
	apiserver *localcluster.Process // set once a fault restarted kube-apiserver
}

// locations of what the cluster needs.
type locations struct {
	binDir, assetsDir, crdDir, admissionDir string
}

func startCluster(ctx context.Context, dir string, loc locations, set settings, logf func(string, ...any)) (*cluster, error) {
	c := &cluster{dir: dir, set: set, log: logf}
	var proxiesMu sync.Mutex
	proxies := map[string]*proxy{}
	// The launcher's progress goes to the run's log at warning level and
	// above: the run prints its own.
	lg := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))
	logf("starting the cluster (etcd, kube-apiserver, versitygw, %d agents, 2 controllers) from %s", processAgents+tenantAgents, loc.assetsDir)
	lc, err := localcluster.Up(ctx, localcluster.LauncherOptions{
		Dir: dir, BinDir: loc.binDir, AssetsDir: loc.assetsDir, CRDDir: loc.crdDir, AdmissionDir: loc.admissionDir,
		Agents: processAgents + tenantAgents, S3: true, Controllers: 2,
		// The plain tasks' agents run at the process level (their
		// commands write start records to the harness's directory); the
		// workspaces' agents get the tenant level from PerAgent.
		Isolation: "process",
		AgentArgs: []string{
			"--upload-backoff-initial", "500ms", "--upload-backoff-max", "5s", "--upload-timeout", "30s",
			// The agent's own part sizes, not the launcher's quicker
			// ones: the run checks the objects the agents upload.
			"--output-part-bytes", strconv.FormatInt(agent.DefaultPartBytes, 10),
			"--output-part-interval", agent.DefaultPartInterval.String(),
		},
		PerAgent: func(i int, a *localcluster.Agent) []string {
			if i < processAgents {
				a.Labels[poolLabel] = "process"
				return nil
			}
			a.Labels[poolLabel] = "tenant"
			// Workspaces: network Node for the beacon.
			return []string{"--isolation", "tenant", "--allowed-networks", "node,none,egress", "--task-network", "node"}
		},
		AgentFront: func(a localcluster.Agent, listen, target string) (io.Closer, error) {
			p, err := newProxy(listen, target)
			if err != nil {
				return nil, err
			}
			proxiesMu.Lock()
			proxies[a.Node] = p
			proxiesMu.Unlock()
			return p, nil
		},
		ControllerArgs: []string{
			"--leader-election-lease-duration", set.leaseDuration.String(),
			"--leader-election-renew-deadline", set.renewDeadline.String(),
			"--leader-election-retry-period", set.retryPeriod.String(),
			"--agent-lost-after", set.agentLostAfter.String(),
			"--max-running-per-owner", strconv.Itoa(set.ownerLimit),
			"--orphan-check-interval", "10s", "--progress-interval", "1s", "--workers", "8",
		},
		Log: lg,
	})
	if err != nil {
		return nil, err
	}
	c.Cluster = lc
	c.cp, c.certs = lc.ControlPlane(), lc.Certs()
	c.s3, c.s3Client, c.bucket = lc.ObjectStore, lc.S3Client(), lc.S3Bucket
	for _, a := range lc.AgentProcesses {
		c.agents = append(c.agents, &agentNode{AgentProcess: a, proxy: proxies[a.Node]})
	}
	for _, n := range lc.Controllers {
		c.controllers = append(c.controllers, &controllerNode{ControllerProcess: n})
	}
	if c.cs, err = kubernetes.NewForConfig(c.cp.Config); err != nil {
		c.stop()
		return nil, err
	}
	if _, err := c.waitLeader(ctx, 60*time.Second); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// s3Ready reports whether the S3 server answers.
func (c *cluster) s3Ready(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.s3Client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(c.bucket)})
	return err == nil
}

// leads reports whether the controller says it holds the lease. A stopped
// or dead controller does not answer and does not lead.
func (n *controllerNode) leads(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.MetricsURL, nil)
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
		if !n.Process.Stopped() && n.leads(ctx) {
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

// httpOK reports whether url answers 200 now.
func httpOK(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// apiReady reports whether kube-apiserver answers /readyz.
func (c *cluster) apiReady(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	return err == nil
}

// disrupt kills p, restarting it after d (kill true), or stops it with
// SIGSTOP for d and resumes it with SIGCONT.
func disrupt(p *localcluster.Process, kill bool, d time.Duration) error {
	if kill {
		return p.Kill(d)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	time.Sleep(d)
	return p.Signal(syscall.SIGCONT)
}

// killAPIServer kills kube-apiserver with SIGKILL and starts it again with
// the same command line restartAfter later. The first time, the process is
// envtest's; the launcher then supervises the new one (Supervise).
func (c *cluster) killAPIServer(restartAfter time.Duration) error {
	c.mu.Lock()
	supervised := c.apiserver
	c.mu.Unlock()
	if supervised != nil {
		return supervised.Kill(restartAfter)
	}
	pid, err := localcluster.ChildPID("kube-apiserver")
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
	p, err := c.Supervise("kube-apiserver", argv[0], argv[1:], env)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = p
	c.mu.Unlock()
	return nil
}

// agentRecords returns the UIDs of the tasks the agent holds, read over
// mTLS with the controller's identity, from the agent's own listener (not
// through its proxy, which a fault may have cut).
func (c *cluster) agentRecords(ctx context.Context, a *agentNode) ([]string, error) {
	tlsCfg, err := tlsutil.ClientConfig(c.certs.Controller, localcluster.AgentServerName)
	if err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient(a.Addr, grpc.WithTransportCredentials(grpccreds.NewTLS(tlsCfg)))
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
	var procs []*localcluster.Process
	for _, n := range c.controllers {
		procs = append(procs, n.Process)
	}
	for _, a := range c.agents {
		procs = append(procs, a.Process)
		if a.proxy != nil {
			a.proxy.heal()
		}
	}
	procs = append(procs, c.s3)
	c.mu.Lock()
	if c.apiserver != nil {
		procs = append(procs, c.apiserver)
	}
	c.mu.Unlock()
	for _, p := range procs {
		if p != nil && p.Stopped() {
			_ = p.Signal(syscall.SIGCONT)
		}
	}
	if pid, err := localcluster.ChildPID("etcd"); err == nil {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// stop ends every fault, then has the launcher undo its steps: the
// controllers, the agents (which stop their tasks) and their proxies, the
// S3 server and the control plane.
func (c *cluster) stop() {
	c.recover()
	if err := c.Close(); err != nil {
		c.log("stopping the cluster: %v", err)
	}
}
