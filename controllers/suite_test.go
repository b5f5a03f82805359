package controllers_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	_ "gocloud.dev/blob/fileblob" // the agents upload to file:// buckets in tests
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/internal/testenv"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

const (
	agentNamespace  = "bashtask-system"
	agentService    = "bashtask-agent"
	agentServerName = "bashtask-agent.bashtask-system.svc"
	// agentLostAfter is short so that the agent-loss test is quick.
	agentLostAfter = 3 * time.Second
	// maxRunningPerOwner applies to tasks that set spec.owner.
	maxRunningPerOwner = 1
)

var (
	env *testenv.Env
	k8s client.Client
	// agents by node name; node-c is reserved for the agent-loss test.
	agents = map[string]*testAgent{}
)

// testAgent is a real agent server (executor/agent) serving mTLS gRPC on a
// loopback address of its own, as an agent pod would on its node.
type testAgent struct {
	node, addr string
	srv        *agent.Server
	grpc       *grpc.Server
	cancel     context.CancelFunc
	done       chan struct{}
}

func (a *testAgent) stop() {
	a.cancel()
	<-a.done
	a.grpc.Stop()
	_ = a.srv.Close()
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if env, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	k8s = env.Client
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dir, err := os.MkdirTemp("", "bashtask-controller-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()

	if err := setUp(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, "setting up the controller test rig:", err)
		return 1
	}
	defer func() {
		for _, a := range agents {
			a.stop()
		}
	}()
	return m.Run()
}

// setUp issues certificates, starts three agents, describes them with a
// Service, an EndpointSlice and Nodes, and starts the controller.
func setUp(ctx context.Context, dir string) error {
	ca, err := tlsutil.NewCA("bashtask test CA", time.Hour)
	if err != nil {
		return err
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		return err
	}
	issue := func(name string, o tlsutil.LeafOptions) (*tlsutil.Files, error) {
		kp, err := ca.Issue(o)
		if err != nil {
			return nil, err
		}
		cert, key, err := kp.WriteFiles(dir, name)
		if err != nil {
			return nil, err
		}
		return tlsutil.NewFiles(cert, key, caFile)
	}
	serverFiles, err := issue("agent", tlsutil.LeafOptions{CommonName: "bashtask-agent", DNSNames: []string{agentServerName}, Server: true})
	if err != nil {
		return err
	}
	clientFiles, err := issue("controller", tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true})
	if err != nil {
		return err
	}

	// One port on several loopback addresses, as pods of a DaemonSet share
	// a container port.
	probe, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		return err
	}
	port := probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close()

	nodes := []struct{ name, ip, zone string }{{"node-a", "127.0.0.2", "a"}, {"node-b", "127.0.0.3", "b"}, {"node-c", "127.0.0.4", "c"}}
	var endpoints []discoveryv1.Endpoint
	for _, n := range nodes {
		a, err := startAgent(ctx, n.name, net.JoinHostPort(n.ip, strconv.Itoa(port)), filepath.Join(dir, n.name), serverFiles)
		if err != nil {
			return fmt.Errorf("starting the agent of %s: %w", n.name, err)
		}
		agents[n.name] = a
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"zone": n.zone}}}
		if err := k8s.Create(ctx, node); err != nil {
			return err
		}
		endpoints = append(endpoints, discoveryv1.Endpoint{
			Addresses:  []string{n.ip},
			NodeName:   ptr.To(n.name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		})
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: agentService},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"app": "bashtask-agent"},
			Ports:     []corev1.ServicePort{{Name: "grpc", Port: int32(port)}},
		},
	}
	if err := k8s.Create(ctx, svc); err != nil {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: agentNamespace, Name: agentService + "-loopback",
			Labels: map[string]string{discoveryv1.LabelServiceName: agentService},
		},
		// The API server refuses loopback addresses in an IPv4 slice; an
		// FQDN slice may carry the IP literals, which dial the same way.
		AddressType: discoveryv1.AddressTypeFQDN,
		Endpoints:   endpoints,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(port))}},
	}
	if err := k8s.Create(ctx, slice); err != nil {
		return err
	}
	return startController(ctx, clientFiles)
}

func startAgent(ctx context.Context, node, addr, stateDir string, files *tlsutil.Files) (*testAgent, error) {
	tlsCfg, err := tlsutil.ServerConfig(files, "bashtask-controller")
	if err != nil {
		return nil, err
	}
	srv, err := agent.New(ctx, agent.Config{
		NodeName:         node,
		PodName:          "bashtask-agent-" + node,
		StateDir:         stateDir,
		MaxConcurrent:    8,
		ProgressInterval: 200 * time.Millisecond,
		Executor:         executor.Config{Shell: "/bin/bash"},
	})
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	srv.Register(g)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() { _ = g.Serve(lis) }()
	runCtx, cancel := context.WithCancel(ctx)
	a := &testAgent{node: node, addr: addr, srv: srv, grpc: g, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(a.done); _ = srv.Run(runCtx) }()
	return a, nil
}

func startController(ctx context.Context, files *tlsutil.Files) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.Level(zapLevel()))))
	tlsCfg, err := tlsutil.ClientConfig(files, agentServerName)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {Namespaces: map[string]cache.Config{agentNamespace: {}}},
		}},
	})
	if err != nil {
		return err
	}
	events := make(chan event.TypedGenericEvent[*bashtaskv1alpha1.BashTask], 1024)
	registry, err := controllers.NewAgentRegistry(controllers.AgentRegistryOptions{
		Reader: mgr.GetClient(), ServiceNamespace: agentNamespace, ServiceName: agentService, PortName: "grpc",
		TLS: tlsCfg, Clock: clock.RealClock{}, Notify: events, Log: ctrl.Log.WithName("agents"),
	})
	if err != nil {
		return err
	}
	if err := registry.SetupWithManager(mgr); err != nil {
		return err
	}
	opts := controllers.DefaultOptions()
	opts.AgentLostAfter = agentLostAfter
	opts.MaxRunningPerOwner = maxRunningPerOwner
	opts.ProgressInterval = 500 * time.Millisecond
	opts.RetryInterval = 500 * time.Millisecond
	r := controllers.NewBashTaskReconciler(mgr.GetClient(), mgr.GetAPIReader(), registry,
		mgr.GetEventRecorder("bashtask-controller"), clock.RealClock{}, opts, controllers.NewMetrics(registry.Agents))
	if err := r.SetupWithManager(mgr, events, 4); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	// Wait until every agent is connected, so tests start from a steady
	// state.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ready := 0
		for _, a := range registry.Agents() {
			if a.Ready {
				ready++
			}
		}
		if ready == len(agents) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("agents not all connected after 30s: %+v", registry.Agents())
}

// zapLevel keeps test output quiet unless BASHTASK_TEST_VERBOSE is set.
func zapLevel() int8 {
	if os.Getenv("BASHTASK_TEST_VERBOSE") != "" {
		return -2
	}
	return 2 // errors only
}

// ctxBackground is the context of polls inside Eventually, which outlive no
// test.
func ctxBackground() context.Context { return context.Background() }
