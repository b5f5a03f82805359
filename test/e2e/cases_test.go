package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/exampletasks"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// TestExamples applies every manifest in examples/, cancels the long one,
// and checks each task's reason against its bashtask.dev/expect-reason.
func TestExamples(t *testing.T) {
	ns := newNamespace(t)
	expect, err := exampletasks.Apply(t.Context(), k8s, filepath.Join(root, "examples"), ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(expect) < 9 {
		t.Fatalf("found %d example tasks, want at least 9", len(expect))
	}
	// The cancel example runs until cancelled.
	waitPhase(t, ns, "long-running", v1.PhaseRunning)
	if _, errOut, code := plugin(t.Context(), "", "-n", ns, "cancel", "long-running"); code != 0 {
		t.Fatalf("kubectl bashtask cancel: exit %d: %s", code, errOut)
	}
	var names []string
	for n := range expect {
		names = append(names, n)
	}
	done := testutil.WaitTerminal(t, k8s, ns, names, 3*time.Minute)
	for _, m := range exampletasks.Mismatches(expect, done) {
		t.Error(m)
	}
	for name, bt := range done {
		if iso := bt.Status.Isolation; iso != nil && ptr.Deref(iso.Level, "") != isolation {
			t.Errorf("%s ran at isolation level %q, want the agents' %q", name, ptr.Deref(iso.Level, ""), isolation)
		}
	}
	secret := done["secret-env"].Status.Stdout
	if secret == nil || !strings.Contains(ptr.Deref(secret.Tail, ""), "DEMO_API_KEY is not visible") || !strings.Contains(ptr.Deref(secret.Tail, ""), "s3cr3t") {
		t.Errorf("secret-env stdout = %s", dump.OneLine(secret))
	}

	// The 2 MB output is truncated in status and whole in S3, once the
	// upload that follows the terminal status is recorded.
	var large *v1.StreamStatus
	deadline := time.Now().Add(time.Minute)
	for {
		bt := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "large-output"}, bt); err != nil {
			t.Fatal(err)
		}
		if meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionOutputUploaded) {
			large = bt.Status.Stdout
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("large-output not uploaded after a minute: %+v", bt.Status.Conditions)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if large == nil || !ptr.Deref(large.Truncated, false) || large.Spill == nil || !strings.HasPrefix(ptr.Deref(large.Spill.URL, ""), "s3://") {
		t.Fatalf("large-output stdout = %s", dump.OneLine(large))
	}
	full, errOut, code := plugin(t.Context(), "", "-n", ns, "logs", "--full", "large-output")
	if code != 0 {
		t.Fatalf("kubectl bashtask logs --full: exit %d: %s", code, errOut)
	}
	sum := sha256.Sum256([]byte(full))
	if total, want := ptr.Deref(large.TotalBytes, 0), ptr.Deref(large.SHA256, ""); int64(len(full)) != total || hex.EncodeToString(sum[:]) != want {
		t.Errorf("stored stream: %d bytes sha256 %x; status: %d bytes sha256 %s", len(full), sum, total, want)
	}
}

func waitPhase(t *testing.T, ns, name string, phase v1.Phase) *v1.BashTask {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		bt := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, bt); err == nil && ptr.Deref(bt.Status.Phase, "") == phase {
			return bt
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s not %s after a minute", ns, name, phase)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPlugin drives kubectl-bashtask run, wait and cancel as a user would.
func TestPlugin(t *testing.T) {
	ns := newNamespace(t)
	t.Run("run: exit code, stdout and stderr apart", func(t *testing.T) {
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--", "echo out; echo err >&2; exit 7")
		if code != 7 || out != "out\n" || !strings.Contains(errOut, "err\n") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("run -i: stdin", func(t *testing.T) {
		out, errOut, code := plugin(t.Context(), "hello stdin\n", "-n", ns, "run", "-i", "--", "tr a-z A-Z")
		if code != 0 || out != "HELLO STDIN\n" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("run: output far past the tail is complete", func(t *testing.T) {
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--name", "seq", "--", "seq 1 200000")
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if code != 0 || len(lines) != 200000 || lines[0] != "1" || lines[199999] != "200000" {
			t.Errorf("exit %d, %d lines, stderr %q", code, len(lines), errOut)
		}
		st := testutil.WaitTerminal(t, k8s, ns, []string{"seq"}, time.Minute)["seq"].Status.Stdout
		sum := sha256.Sum256([]byte(out))
		if st == nil || !ptr.Deref(st.Truncated, false) || int64(len(out)) != ptr.Deref(st.TotalBytes, 0) || hex.EncodeToString(sum[:]) != ptr.Deref(st.SHA256, "") {
			t.Errorf("run wrote %d bytes, sha256 %x; status %s", len(out), sum, dump.OneLine(st))
		}
	})
	t.Run("wait and cancel", func(t *testing.T) {
		bt := &v1.BashTask{}
		bt.Namespace, bt.Name = ns, "to-cancel"
		bt.Spec.Command = "sleep 300"
		bt.Spec.KillGracePeriodSeconds = ptr.To[int32](1)
		if err := k8s.Create(t.Context(), bt); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, ns, "to-cancel", v1.PhaseRunning)
		if _, errOut, code := plugin(t.Context(), "", "-n", ns, "cancel", "to-cancel"); code != 0 {
			t.Fatalf("cancel: exit %d: %s", code, errOut)
		}
		_, errOut, code := plugin(t.Context(), "", "-n", ns, "wait", "--timeout", "30s", "to-cancel")
		if code == 0 || code == 124 || !strings.Contains(errOut, "Cancelled") {
			t.Errorf("wait: exit %d, stderr %q; want a failure naming Cancelled", code, errOut)
		}
	})
}

// TestControllerRestartRunsOnce is C29: the controller is killed right
// after dispatch, and again in the middle of a batch; every command runs
// exactly once and every task ends Succeeded.
func TestControllerRestartRunsOnce(t *testing.T) {
	ns := newNamespace(t)
	one := &v1.BashTask{}
	one.Namespace, one.Name = ns, "once"
	one.Spec.Command = countingCommand("sleep 1")
	if err := k8s.Create(t.Context(), one); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		bt := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(one), bt); err == nil && ptr.Deref(bt.Status.NodeName, "") != "" {
			one = bt
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not dispatched after a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
	killComponent(t, "controller")

	var names []string
	for i := range 60 {
		bt := &v1.BashTask{}
		bt.Namespace, bt.Name = ns, fmt.Sprintf("batch-%02d", i)
		bt.Spec.Command = countingCommand("true")
		if err := k8s.Create(t.Context(), bt); err != nil {
			t.Fatal(err)
		}
		names = append(names, bt.Name)
		if i == 30 {
			killComponent(t, "controller")
		}
	}
	done := testutil.WaitTerminal(t, k8s, ns, append(names, "once"), 3*time.Minute)
	runs := countRuns(t)
	for name, bt := range done {
		if reason := ptr.Deref(bt.Status.Reason, ""); reason != v1.ReasonSucceeded {
			t.Errorf("%s ended %s: %s", name, reason, ptr.Deref(bt.Status.Message, ""))
		}
		if n := runs[string(bt.UID)]; n != 1 {
			t.Errorf("%s ran %d times, want exactly once", name, n)
		}
	}
}

// TestAgentKilledDuringTask is C30 with the agent back: the task ends
// AgentRestarted and keeps the output written before the kill.
func TestAgentKilledDuringTask(t *testing.T) {
	ns := newNamespace(t)
	bt := &v1.BashTask{}
	bt.Namespace, bt.Name = ns, "agent-killed"
	bt.Spec.Command = "echo before; sleep 60"
	bt.Spec.NodeName = ptr.To("node-2")
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got := &v1.BashTask{}
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), got); err == nil && got.Status.Stdout != nil && ptr.Deref(got.Status.Stdout.Tail, "") == "before\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("task did not print before in a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	start := time.Now()
	killComponent(t, "agent-node-2")
	done := testutil.WaitTerminal(t, k8s, ns, []string{"agent-killed"}, 2*time.Minute)["agent-killed"]
	if reason := ptr.Deref(done.Status.Reason, ""); reason != v1.ReasonAgentRestarted {
		t.Fatalf("reason %s (%s), want AgentRestarted", reason, ptr.Deref(done.Status.Message, ""))
	}
	if done.Status.Stdout == nil || ptr.Deref(done.Status.Stdout.Tail, "") != "before\n" {
		t.Errorf("stdout %s, want before\\n kept", dump.OneLine(done.Status.Stdout))
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("AgentRestarted after %s", took)
	}
	// The new incarnation recovered the task; once its terminal status is
	// written the controller has it forgotten, which removes its spill
	// directory ("before" made one).
	spill := filepath.Join(clusterDir, "agents", "node-2", "tasks", string(done.UID))
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(spill); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there 30 s after the task ended: the recovered task was not forgotten", spill)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestThousandTasks is C31: 1000 tasks created at once across two agents
// all end, none twice, none lost.
func TestThousandTasks(t *testing.T) {
	ns := newNamespace(t)
	const n = 1000
	names := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				bt := &v1.BashTask{}
				bt.Namespace, bt.Name = ns, fmt.Sprintf("t-%04d", i)
				bt.Spec.Command = countingCommand("true")
				if err := k8s.Create(t.Context(), bt); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		names[i] = fmt.Sprintf("t-%04d", i)
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, names, 5*time.Minute)
	runs := countRuns(t)
	nodes := map[string]int{}
	for name, bt := range done {
		if reason := ptr.Deref(bt.Status.Reason, ""); reason != v1.ReasonSucceeded {
			t.Errorf("%s ended %s: %s", name, reason, ptr.Deref(bt.Status.Message, ""))
		}
		if c := runs[string(bt.UID)]; c != 1 {
			t.Errorf("%s ran %d times", name, c)
		}
		nodes[ptr.Deref(bt.Status.NodeName, "")]++
	}
	if len(nodes) != 2 {
		t.Errorf("tasks per node %v, want both agents used", nodes)
	}
}

// TestTTL is C32: the task is gone about 5 s after it finished.
func TestTTL(t *testing.T) {
	ns := newNamespace(t)
	bt := &v1.BashTask{}
	bt.Namespace, bt.Name = ns, "ttl"
	bt.Spec.Command = "true"
	bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](5)
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{"ttl"}, time.Minute)["ttl"]
	finished := done.Status.CompletionTime.Time
	deadline := time.Now().Add(time.Minute)
	for {
		err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), &v1.BashTask{})
		if client.IgnoreNotFound(err) == nil && err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("task still there a minute after finishing")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if gone := time.Since(finished); gone < 4*time.Second || gone > 12*time.Second {
		t.Errorf("deleted %s after finishing, want about 5 s", gone.Round(100*time.Millisecond))
	}
}
