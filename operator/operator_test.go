package operator_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
	"github.com/bashtask/bashtask-operator/operator"
)

// recordingManager records what is added to the manager it wraps.
type recordingManager struct {
	manager.Manager
	mu    sync.Mutex
	added []manager.Runnable
}

func (m *recordingManager) Add(r manager.Runnable) error {
	m.mu.Lock()
	m.added = append(m.added, r)
	m.mu.Unlock()
	return m.Manager.Add(r)
}

// TestSetup adds the controller to a manager against a real
// kube-apiserver, checks that every part the binary relies on was added
// and registered, then runs the manager: the output API answers and a
// BashTask is reconciled (it gets the controller's finalizer, though no
// agent exists to run it).
func TestSetup(t *testing.T) {
	dir := t.TempDir()
	certs, err := localcluster.IssueCerts(filepath.Join(dir, "certs"), localcluster.AgentServerName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	env, err := testenv.StartWith(certs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	tlsCfg, err := tlsutil.ClientConfig(certs.Controller, localcluster.AgentServerName)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	port, err := localcluster.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts := operator.Options{
		AgentNamespace: localcluster.AgentNamespace,
		AgentService:   localcluster.AgentService,
		AgentPortName:  localcluster.AgentPortName,
		AgentTLS:       tlsCfg,
		Controller:     controllers.DefaultOptions(),
		Workers:        2,
		Metrics:        reg,
		OutputAPI: operator.OutputAPIOptions{
			Port: port, BindAddress: net.IPv4(127, 0, 0, 1), CertDir: certs.OutputAPIDir, Kubeconfig: kubeconfig,
		},
	}
	inner, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  operator.CacheOptions(opts),
	})
	if err != nil {
		t.Fatal(err)
	}
	mgr := &recordingManager{Manager: inner}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	op, err := operator.Setup(ctx, mgr, opts)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	defer op.Close()

	// The runnables: the registry, the orphan collector, the output API
	// (on every replica) and the two reconcilers' controllers.
	if !slices.Contains(mgr.added, manager.Runnable(op.Registry)) {
		t.Error("the agent registry was not added to the manager")
	}
	if !slices.Contains(mgr.added, manager.Runnable(op.Orphans)) {
		t.Error("the orphan collector was not added to the manager")
	}
	if op.OutputAPI == nil {
		t.Error("no output API server, though a port was set")
	}
	everyReplica := 0
	for _, r := range mgr.added {
		if le, ok := r.(manager.LeaderElectionRunnable); ok && !le.NeedLeaderElection() {
			everyReplica++
		}
	}
	// The output API runs without the lead, so every replica serves it.
	if everyReplica == 0 {
		t.Error("no runnable that runs on every replica: the output API is missing")
	}
	if got := len(mgr.added); got < 5 {
		t.Errorf("%d runnables added, want at least 5 (registry, two controllers, orphan collector, output API): %T", got, mgr.added)
	}
	// The collectors are in the registry: registering one again fails.
	for name, c := range map[string]prometheus.Collector{"watch stream ends": op.Registry.StreamEnds} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); !errors.As(err, &already) {
			t.Errorf("%s: not registered by Setup (registering again: %v)", name, err)
		}
	}
	if err := op.Metrics.Register(reg); err == nil {
		t.Error("the task metrics were not registered by Setup")
	}

	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	// The output API serves (its /healthz needs no credentials).
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a self-signed test server
	testutil.WaitFor(t, "the output API answers /healthz", time.Minute, func() error {
		resp, err := hc.Get("https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/healthz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	})

	// The BashTask reconciler runs.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "setup-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "t"},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "true", NodeName: ptr.To("node-a")},
	}
	if err := env.Client.Create(ctx, bt); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the task has the controller's finalizer", time.Minute, func() error {
		got := &bashtaskv1alpha1.BashTask{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(bt), got); err != nil {
			return err
		}
		if !slices.Contains(got.Finalizers, controllers.Finalizer) {
			return fmt.Errorf("finalizers %v", got.Finalizers)
		}
		return nil
	})
}

// TestSetupRequiresTLS: no plaintext mode.
func TestSetupRequiresTLS(t *testing.T) {
	if _, err := operator.Setup(t.Context(), nil, operator.Options{AgentNamespace: "a", AgentService: "b"}); err == nil {
		t.Error("Setup accepted options without a TLS configuration")
	}
}
