// Package e2e runs the whole system as separate processes, the way users
// run it: bashtask-local starts etcd, kube-apiserver, the controller, two
// agents and a versitygw S3 server; the tests drive it through the API and
// the kubectl plugin, and kill components to check what survives.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/mounts"
	"github.com/bashtask/bashtask-operator/internal/rig/exampletasks"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
)

var (
	root, clusterDir, binDir string
	k8s                      client.Client
	// isolation is the agents' isolation level, as bashtask-local reports it.
	isolation v1.IsolationLevel
	// counter counts the runs of the commands that count their executions.
	counter *exampletasks.RunCounter
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binDir = filepath.Join(root, "bin")
	for _, b := range []string{"bashtask-local", "bashtask-controller", "bashtask-agent", "kubectl-bashtask", "versitygw", "k8s/kube-apiserver", "k8s/etcd"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %s is missing; run the suite through `make test-e2e`, which builds it: %v\n", filepath.Join(binDir, b), err)
			return 1
		}
	}
	tmp, err := os.MkdirTemp("", "bashtask-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		// Workspaces the tests left keep their file systems mounted, as
		// they do across an agent restart.
		_ = mounts.UnmountUnder(tmp)
		_ = os.RemoveAll(tmp)
	}()
	clusterDir = filepath.Join(tmp, "cluster")
	// The agents' tasks share the host's network (spec.network Node).
	if counter, err = exampletasks.NewRunCounter("127.0.0.1"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = counter.Close() }()

	lc, err := startCluster(clusterDir,
		"--agents", "2", "--s3", "--agent-env", "DEMO_API_KEY=agent-only-secret",
		// The run counter listens on the host's loopback, which the tenant
		// level's default network (Egress) does not reach.
		"--agent-arg=--task-network=node",
		"--controller-arg=--agent-lost-after=20s", "--controller-arg=--progress-interval=500ms",
		"--controller-arg=--workers=16", "--controller-arg=--kube-api-qps=500", "--controller-arg=--kube-api-burst=1000")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer lc.stop()
	out := lc.out
	if m := regexp.MustCompile(`at isolation (\w+)`).FindStringSubmatch(out.String()); m != nil {
		isolation = v1.IsolationLevel(m[1])
	} else {
		fmt.Fprintf(os.Stderr, "e2e: bashtask-local did not say its isolation level:\n%s", out.String())
		return 1
	}
	if k8s, err = clusterClient(context.Background(), clusterDir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		localcluster.WriteLogTails(os.Stderr, clusterDir, 40)
	}
	return code
}

// launched is a bashtask-local process running a cluster.
type launched struct {
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	exited chan struct{}
}

// startCluster runs bashtask-local up in dir at the suite's isolation level
// (E2E_ISOLATION; empty is the launcher's default, tenant as root like the
// chart's) with the extra flags, and returns once it is up.
func startCluster(dir string, extra ...string) (*launched, error) {
	args := append([]string{"up", "--dir", dir, "--bin-dir", binDir,
		"--assets-dir", filepath.Join(binDir, "k8s"), "--crd-dir", filepath.Join(root, "config", "crd", "bases"), "--admission-dir", filepath.Join(root, "config", "admission"),
		"--isolation", os.Getenv("E2E_ISOLATION")}, extra...)
	l := &launched{cmd: exec.Command(filepath.Join(binDir, "bashtask-local"), args...), out: &syncbuf.Buffer{}, exited: make(chan struct{})}
	l.cmd.Stdout, l.cmd.Stderr = l.out, l.out
	if err := l.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = l.cmd.Wait(); close(l.exited) }()
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(l.out.String(), "is up") {
		select {
		case <-l.exited:
			return nil, fmt.Errorf("bashtask-local exited:\n%s", l.out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			l.stop()
			return nil, fmt.Errorf("bashtask-local not up after 3 minutes:\n%s", l.out.String())
		}
	}
	return l, nil
}

// stop ends the cluster and waits until the launcher has stopped
// everything it started.
func (l *launched) stop() {
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.exited:
	case <-time.After(60 * time.Second):
		_ = l.cmd.Process.Kill()
		<-l.exited
	}
}

// clusterClient is an administrator's client of the cluster in dir, once
// it resolves BashTasks.
func clusterClient(ctx context.Context, dir string) (client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	scheme, err := localcluster.NewScheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	// Even once the kind is served, a client's REST mapper may read an older
	// discovery document on a loaded machine; start when it resolves.
	for deadline := time.Now().Add(time.Minute); ; {
		err := c.List(ctx, &v1.BashTaskList{}, client.Limit(1))
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("BashTasks not served: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// componentPid returns the current pid of a supervised component.
func componentPid(t *testing.T, name string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(clusterDir, "pids", name))
	if err != nil {
		t.Fatalf("pid of %s: %v", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// killComponent sends SIGKILL to a component and waits until the launcher
// has started it again and it is serving.
func killComponent(t *testing.T, name string) {
	t.Helper()
	pid := componentPid(t, name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s (pid %d): %v", name, pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for componentPidOrZero(name) == pid || componentPidOrZero(name) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s was not restarted", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func componentPidOrZero(name string) int {
	raw, err := os.ReadFile(filepath.Join(clusterDir, "pids", name))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	return pid
}

// countRuns returns how many times each task UID's counting command ran.
func countRuns(*testing.T) map[string]int { return counter.Runs() }

// countingCommand reports one execution of its task to the counter, then
// runs rest.
func countingCommand(rest string) string { return counter.Command(rest) }

// plugin runs kubectl-bashtask against the local cluster with the
// administrator's kubeconfig and no bucket credentials: it reads output
// through the output API.
func plugin(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
	return exampletasks.RunPlugin(ctx, filepath.Join(binDir, "kubectl-bashtask"), filepath.Join(clusterDir, "kubeconfig"), nil, stdin, args...)
}
