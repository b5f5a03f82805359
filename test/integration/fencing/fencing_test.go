package fencing_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// Lease settings of the controllers under test: short, so the test is
// quick; the renew deadline leaves a second of fencing margin.
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = 500 * time.Millisecond
	leaseName     = "bashtask-controller.bashtask.dev"
	leaseNS       = "default"
)

// controller is one bashtask-controller process.
type controller struct {
	name string
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{}
	err  error
}

func startController(t *testing.T, name, kubeconfig string) *controller {
	t.Helper()
	certs := rig.Certs
	c := &controller{name: name, out: &syncbuf.Buffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(controllerBin,
		"--kubeconfig", kubeconfig,
		"--leader-elect=true", "--leader-election-namespace", leaseNS,
		"--leader-election-lease-duration", leaseDuration.String(),
		"--leader-election-renew-deadline", renewDeadline.String(),
		"--leader-election-retry-period", retryPeriod.String(),
		"--agent-namespace", localcluster.AgentNamespace, "--agent-service", localcluster.AgentService,
		"--agent-port-name", localcluster.AgentPortName, "--agent-server-name", localcluster.AgentServerName,
		"--tls-cert-file", certs.ControllerCertFile, "--tls-key-file", certs.ControllerKeyFile, "--tls-ca-file", certs.CAFile,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--running-status-delay", "0s", "--workers", "4", "--zap-log-level", "info",
	)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", c.name, tail(c.out.String(), 8000))
		}
	})
	return c
}

func (c *controller) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// leaseHolder returns the Lease's holder and transitions, "" before any.
func leaseHolder(ctx context.Context) (string, int32) {
	var l coordinationv1.Lease
	if err := rig.Client.Get(ctx, client.ObjectKey{Namespace: leaseNS, Name: leaseName}, &l); err != nil {
		return "", 0
	}
	return ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0)
}

// accepted counts the calls the agents accepted from holder after since.
func accepted(holder string, since time.Time, rpcs ...string) int {
	n := 0
	for _, c := range calls.all() {
		if c.accepted && c.fence.GetHolder() == holder && !c.at.Before(since) && (len(rpcs) == 0 || contains(rpcs, c.rpc)) {
			n++
		}
	}
	return n
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestPausedLeaderMakesNoAcceptedCall runs two controllers with leader
// election while tasks keep being created, stops the leader with SIGSTOP
// for twice its lease duration, lets the other take over, resumes the first
// with SIGCONT, and checks from the agents' side that no Start, Cancel or
// Watch of the resumed process was accepted after it resumed, that it
// exits, and that every task ran exactly once.
func TestPausedLeaderMakesNoAcceptedCall(t *testing.T) {
	ctx := t.Context()
	kubeconfig, ns := newRun(t, "fencing-")
	a := startController(t, "controller-a", kubeconfig)
	// The Lease outlives each test with the holder of the last one (until
	// it expires): controller-a leads once the holder is its own identity.
	testutil.WaitFor(t, "controller-a leads", 30*time.Second, testutil.Check(func() bool { h, _ := leaseHolder(ctx); return h != "" && strings.Contains(a.out.String(), h) }, func() string { h, n := leaseHolder(ctx); return fmt.Sprintf("lease holder %q, %d transitions", h, n) }))
	b := startController(t, "controller-b", kubeconfig)
	oldHolder, oldEpoch := leaseHolder(ctx)
	if !strings.Contains(a.out.String(), oldHolder) {
		t.Fatalf("the Lease is held by %q, which is not controller-a", oldHolder)
	}

	// A steady stream of tasks, some of them cancelled while they run.
	stop := make(chan struct{})
	created := make(chan []*v1.BashTask, 1)
	go func() {
		var tasks []*v1.BashTask
		defer func() { created <- tasks }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			bt := &v1.BashTask{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("t-%04d", i)},
				Spec: v1.BashTaskSpec{Command: "sleep 0." + strconv.Itoa(i%10), TimeoutSeconds: ptr.To[int32](60),
					KillGracePeriodSeconds: ptr.To[int32](1)},
			}
			if i%7 == 3 {
				bt.Spec.Command = "sleep 30"
			}
			if err := rig.Client.Create(context.Background(), bt); err != nil {
				continue
			}
			tasks = append(tasks, bt)
			if i%7 == 3 {
				// Cancelled a little later, while it runs.
				go func(bt *v1.BashTask) {
					time.Sleep(700 * time.Millisecond)
					_ = rig.Client.Patch(context.Background(), bt.DeepCopy(), client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"cancelRequested":true}}`)))
				}(bt)
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()

	testutil.WaitFor(t, "controller-a starts tasks", 30*time.Second, testutil.Check(func() bool { return accepted(oldHolder, time.Time{}, "Start") >= 10 }, func() string {
		return fmt.Sprintf("%d Start calls accepted", accepted(oldHolder, time.Time{}, "Start"))
	}))
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	var newHolder string
	testutil.WaitFor(t, "controller-b takes over", 30*time.Second, testutil.Check(func() bool {
		h, _ := leaseHolder(ctx)
		newHolder = h
		return h != "" && h != oldHolder
	}, func() string { h, n := leaseHolder(ctx); return fmt.Sprintf("lease holder %q, %d transitions", h, n) }))
	_, newEpoch := leaseHolder(ctx)
	if newEpoch <= oldEpoch {
		t.Errorf("lease transitions %d after the takeover, want more than %d", newEpoch, oldEpoch)
	}
	testutil.WaitFor(t, "controller-b starts tasks", 30*time.Second, testutil.Check(func() bool { return accepted(newHolder, stoppedAt, "Start") >= 3 }, func() string {
		return fmt.Sprintf("%d Start calls accepted from %s", accepted(newHolder, stoppedAt, "Start"), newHolder)
	}))
	// Paused well past its lease: a process that stops for a while
	// (a long GC pause, a frozen VM, SIGSTOP) and then carries on.
	time.Sleep(time.Until(stoppedAt.Add(2 * leaseDuration)))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumedAt := time.Now()

	// The resumed process gives up the lead and exits.
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Errorf("controller-a still runs 20 s after it resumed without the lead")
	}
	time.Sleep(2 * time.Second) // more tasks for controller-b alone
	close(stop)
	tasks := <-created

	if n := accepted(oldHolder, resumedAt); n != 0 {
		for _, c := range calls.all() {
			if c.accepted && c.fence.GetHolder() == oldHolder && !c.at.Before(resumedAt) {
				t.Errorf("after it resumed, the agents accepted %s %s from the paused leader (epoch %d)", c.rpc, c.uid, c.fence.GetEpoch())
			}
		}
	}
	refusedAtAgents := 0
	for _, c := range calls.all() {
		if !c.accepted && c.fence.GetHolder() == oldHolder && strings.Contains(c.message, "fenced") {
			refusedAtAgents++
		}
	}
	t.Logf("paused for %s; after resuming, controller-a logged %d refusals of its own and the agents refused %d of its calls; it exited: %v",
		resumedAt.Sub(stoppedAt).Round(time.Millisecond), strings.Count(a.out.String(), "not sure to lead"), refusedAtAgents, a.err)
	if a.exited() && a.err == nil {
		t.Errorf("controller-a exited with status 0 after losing the lead; want an error exit")
	}
	if b.exited() {
		t.Fatalf("controller-b exited: %v", b.err)
	}

	// Every task ends, and none was started twice.
	for _, bt := range tasks {
		testutil.WaitFor(t, bt.Name+" ends", time.Minute, testutil.Check(func() bool {
			var got v1.BashTask
			if err := rig.Client.Get(ctx, client.ObjectKeyFromObject(bt), &got); err != nil {
				return false
			}
			return got.Status.Reason != nil
		}, nil))
	}
	starts := map[string]int{}
	for _, c := range calls.all() {
		if c.rpc == "Start" && c.accepted && !c.alreadyKnown {
			starts[c.uid]++
		}
	}
	for uid, n := range starts {
		if n > 1 {
			t.Errorf("task %s started %d times", uid, n)
		}
	}
	t.Logf("%d tasks; %d starts by controller-a before the pause, %d by controller-b", len(tasks),
		accepted(oldHolder, time.Time{}, "Start"), accepted(newHolder, time.Time{}, "Start"))
}

// TestLeaseCountGoesBack makes the Lease's count go back under the
// agents' epoch, as deleting the Lease (or moving it to another namespace)
// does: an operator raises the count, the leader stops, the Lease is
// deleted, and a new controller creates it again from 0. The agents refuse
// the new leader's first calls; it raises the count above their epoch at
// its next renewal and goes on dispatching.
func TestLeaseCountGoesBack(t *testing.T) {
	ctx := t.Context()
	kubeconfig, ns := newRun(t, "lease-")
	run := func(name string) {
		t.Helper()
		bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Spec: v1.BashTaskSpec{Command: "true", TimeoutSeconds: ptr.To[int32](30)}}
		if err := rig.Client.Create(ctx, bt); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, name+" succeeds", 30*time.Second, testutil.Check(func() bool {
			var got v1.BashTask
			return rig.Client.Get(ctx, client.ObjectKeyFromObject(bt), &got) == nil &&
				ptr.Deref(got.Status.Reason, "") == v1.ReasonSucceeded
		}, nil))
	}
	leads := func(c *controller) func() bool {
		return func() bool { h, _ := leaseHolder(ctx); return h != "" && strings.Contains(c.out.String(), h) }
	}

	c := startController(t, "controller-c", kubeconfig)
	testutil.WaitFor(t, "controller-c leads", 60*time.Second, testutil.Check(leads(c), func() string { h, n := leaseHolder(ctx); return fmt.Sprintf("lease holder %q, %d transitions", h, n) }))
	run("before")
	// An operator raises the count (the documented way out); the leader
	// keeps it and the agents see it.
	_, was := leaseHolder(ctx)
	raised := was + 5
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: leaseNS, Name: leaseName}}
	patch := fmt.Appendf(nil, `{"spec":{"leaseTransitions":%d}}`, raised)
	if err := rig.Client.Patch(ctx, lease, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "controller-c renews at the patched count", 30*time.Second, testutil.Check(func() bool {
		return strings.Contains(c.out.String(), fmt.Sprintf(`"epoch":%d`, raised))
	}, nil))
	patched := time.Now()
	run("patched")
	for _, cl := range calls.all() {
		if cl.accepted && cl.rpc == "Start" && !cl.at.Before(patched) && cl.fence.GetEpoch() != int64(raised) {
			t.Errorf("after the patch a Start carried epoch %d, want %d", cl.fence.GetEpoch(), raised)
		}
	}

	// The leader stops, the Lease goes, a new controller starts from 0.
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.done
	if err := rig.Client.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	d := startController(t, "controller-d", kubeconfig)
	testutil.WaitFor(t, "controller-d leads", 60*time.Second, testutil.Check(leads(d), func() string { h, n := leaseHolder(ctx); return fmt.Sprintf("lease holder %q, %d transitions", h, n) }))
	for i := range 3 {
		run(fmt.Sprintf("after-%d", i))
	}
	h, after := leaseHolder(ctx)
	if !strings.Contains(d.out.String(), h) || after <= raised {
		t.Errorf("the Lease is held by %q with %d transitions; want controller-d above %d", h, after, raised)
	}
	if !strings.Contains(d.out.String(), "raising the epoch") {
		t.Errorf("controller-d did not log raising its epoch")
	}
	if d.exited() {
		t.Errorf("controller-d exited: %v", d.err)
	}
	t.Logf("Lease transitions %d, raised to %d, created again and raised to %d", was, raised, after)
}

// newRun writes the administrator's kubeconfig for the controller
// processes of one test and creates the test's namespace, named from
// prefix.
func newRun(t *testing.T, prefix string) (kubeconfig string, ns *corev1.Namespace) {
	t.Helper()
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := rig.Env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	ns = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := rig.Client.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, ns
}
