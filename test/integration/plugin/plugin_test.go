package plugin_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

func TestRunExitCodeAndStreams(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := []struct {
		name string
		args []string
		want result
	}{{
		name: "non-zero exit passes through, streams apart",
		args: []string{"--", "echo out; echo err >&2; exit 3"},
		want: result{code: 3, stdout: "out\n", stderr: "err\n"},
	}, {
		name: "words joined into one command",
		args: []string{"--", "printf", "'%s-%s'", "a", "b"},
		want: result{code: 0, stdout: "a-b"},
	}, {
		name: "output written over time",
		args: []string{"--", "for i in 1 2 3; do echo $i; sleep 0.3; done"},
		want: result{code: 0, stdout: "1\n2\n3\n"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := kubectlBashtask(t, ns, append([]string{"run"}, tc.args...)...)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(result{})); diff != "" {
				t.Errorf("run %q (-want +got):\n%s", tc.args, diff)
			}
		})
	}
}

func TestRunEndingWithoutExitIsOneWithReason(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	got := kubectlBashtask(t, ns, "run", "--name", "slow", "--timeout", "1s", "--", "sleep 30")
	bt := getTask(t, ns, "slow")
	if reason := ptr.Deref(bt.Status.Reason, ""); reason != bashtaskv1alpha1.ReasonTimedOut {
		t.Fatalf("reason %q, want TimedOut", reason)
	}
	if want := exitOf(bt); got.code != want || !strings.Contains(got.stderr, "ended TimedOut") {
		t.Errorf("run of a timed-out task: exit %d, stderr %q; want exit %d and a message naming TimedOut", got.code, got.stderr, want)
	}
}

func TestRunStdin(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	got := invocation{stdin: strings.NewReader("hello\nworld\n")}.run(t, ns, "run", "-i", "--", "tr a-z A-Z")
	if diff := cmp.Diff(result{stdout: "HELLO\nWORLD\n"}, got, cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("run -i (-want +got):\n%s", diff)
	}

	big := strings.NewReader(strings.Repeat("x", bashtaskv1alpha1.MaxStdinBytes+1))
	got = invocation{stdin: big}.run(t, ns, "run", "-i", "--", "wc -c")
	if got.code != plugin.ExitPluginError || !strings.Contains(got.stderr, "262144") || !strings.Contains(got.stderr, "spec.stdin") {
		t.Errorf("run -i with too much stdin: exit %d, stderr %q; want %d and the limit of spec.stdin", got.code, got.stderr, plugin.ExitPluginError)
	}
}

func TestRunEnv(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "creds"},
		Data:       map[string][]byte{"API_TOKEN": []byte("s3cr3t"), "MODE": []byte("from-secret")},
	}
	if err := rig.Client.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	got := kubectlBashtask(t, ns, "run", "--name", "env", "--env", "MODE=explicit", "--env", "PAIR=a=b",
		"--env-from-secret", "creds", "--", `echo "$MODE $PAIR $API_TOKEN"`)
	if diff := cmp.Diff(result{stdout: "explicit a=b s3cr3t\n"}, got, cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("run --env --env-from-secret (-want +got):\n%s", diff)
	}
	// The Secret's value travels as a reference, never in the task.
	wantEnv := []bashtaskv1alpha1.EnvVar{
		{Name: "MODE", Value: new("explicit")},
		{Name: "PAIR", Value: new("a=b")},
		{Name: "API_TOKEN", ValueFrom: &bashtaskv1alpha1.ValueSource{SecretKeyRef: &bashtaskv1alpha1.KeySelector{Name: "creds", Key: "API_TOKEN"}}},
	}
	if diff := cmp.Diff(wantEnv, getTask(t, ns, "env").Spec.Env); diff != "" {
		t.Errorf("spec.env (-want +got):\n%s", diff)
	}
}

func TestLargeOutputRunAndLogsFull(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const size = 2 << 20
	// Random bytes: not UTF-8, so the tails are sanitized and only the
	// output API has the stream's bytes; and far more than a tail.
	got := kubectlBashtask(t, ns, "run", "--name", "big", "--", "head -c 2097152 /dev/urandom; echo done >&2")
	if got.code != 0 || taskLines(got.stderr) != "done\n" {
		t.Fatalf("run: exit %d, stderr %q", got.code, got.stderr)
	}
	// The upload of the stream ends after the task did: its reference is
	// in the status once OutputUploaded is True, a pass after the
	// terminal write that `run` returned on.
	var bt *bashtaskv1alpha1.BashTask
	testutil.WaitFor(t, "the stream's upload recorded", 30*time.Second, func() error {
		bt = getTask(t, ns, "big")
		if c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionOutputUploaded); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("OutputUploaded: %s", dump.OneLine(c))
		}
		return nil
	})
	out := bt.Status.Stdout
	if out == nil || ptr.Deref(out.TotalBytes, 0) != size || !ptr.Deref(out.Truncated, false) || out.Spill == nil {
		t.Fatalf("status.stdout %s: want %d bytes, truncated, stored", dump.OneLine(out), size)
	}
	total, want, outTail := *out.TotalBytes, ptr.Deref(out.SHA256, ""), ptr.Deref(out.Tail, "")
	if sum := sha256hex(got.stdout); len(got.stdout) != size || sum != want {
		t.Errorf("run wrote %d bytes with sha256 %s; status has %d bytes, %s", len(got.stdout), sum, total, want)
	}

	full := kubectlBashtask(t, ns, "logs", "big", "--full")
	if sum := sha256hex(full.stdout); full.code != 0 || len(full.stdout) != size || sum != want {
		t.Errorf("logs --full: exit %d, %d bytes, sha256 %s, stderr %q; want %d bytes, sha256 %s", full.code, len(full.stdout), sum, full.stderr, size, want)
	}
	// Like kubectl logs: the whole stream, without --full too.
	whole := kubectlBashtask(t, ns, "logs", "big")
	if sum := sha256hex(whole.stdout); whole.code != 0 || sum != want {
		t.Errorf("logs: exit %d, %d bytes, sha256 %s, stderr %q; want %d bytes, sha256 %s", whole.code, len(whole.stdout), sum, whole.stderr, size, want)
	}
	tail := kubectlBashtask(t, ns, "logs", "big", "--tail-only")
	if tail.code != 0 || tail.stdout != outTail || !strings.Contains(tail.stderr, "without --tail-only logs prints the whole stream") {
		t.Errorf("logs --tail-only: exit %d, %d bytes, stderr %q; want the %d-byte tail and a note", tail.code, len(tail.stdout), tail.stderr, len(outTail))
	}
	errLogs := kubectlBashtask(t, ns, "logs", "big", "--stderr", "--full")
	if diff := cmp.Diff(result{stdout: "done\n"}, errLogs, cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("logs --stderr --full (-want +got):\n%s", diff)
	}
}

func TestLogsFollow(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ticks"},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "for i in 1 2 3 4; do echo tick$i; sleep 0.3; done"},
	}
	if err := rig.Client.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	got := kubectlBashtask(t, ns, "logs", "ticks", "-f")
	if diff := cmp.Diff(result{stdout: "tick1\ntick2\ntick3\ntick4\n"}, got, cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("logs -f (-want +got):\n%s", diff)
	}
}

func TestCancelAndWait(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "long"},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "sleep 60"},
	}
	if err := rig.Client.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the task runs", 30*time.Second, testutil.Check(func() bool {
		return ptr.Deref(getTask(t, ns, "long").Status.Phase, "") == bashtaskv1alpha1.PhaseRunning
	}, func() string { return fmt.Sprintf("status %+v", getTask(t, ns, "long").Status) }))

	if got := kubectlBashtask(t, ns, "wait", "long", "--timeout", "500ms"); got.code != plugin.ExitWaitTimeout || !strings.Contains(got.stderr, "still Running") {
		t.Errorf("wait --timeout on a running task: exit %d, stderr %q; want %d", got.code, got.stderr, plugin.ExitWaitTimeout)
	}
	want := result{stdout: "bashtask.bashtask.dev/long cancel requested\n"}
	if diff := cmp.Diff(want, kubectlBashtask(t, ns, "cancel", "long"), cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("cancel (-want +got):\n%s", diff)
	}
	got := kubectlBashtask(t, ns, "wait", "long")
	if got.code != exitOf(getTask(t, ns, "long")) || !strings.HasPrefix(got.stdout, "bashtask.bashtask.dev/long Cancelled") || !strings.Contains(got.stderr, "ended Cancelled") {
		t.Errorf("wait on a cancelled task: %+v; want the exit code and Cancelled", got)
	}
	// Cancel is idempotent.
	want = result{stdout: "bashtask.bashtask.dev/long already ended (Cancelled)\n"}
	if diff := cmp.Diff(want, kubectlBashtask(t, ns, "cancel", "long"), cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("second cancel (-want +got):\n%s", diff)
	}

	if got := kubectlBashtask(t, ns, "run", "--name", "five", "--", "exit 5"); got.code != 5 {
		t.Fatalf("run exit 5: %+v", got)
	}
	want = result{code: 5, stdout: "bashtask.bashtask.dev/five NonZeroExit (exit code 5)\n"}
	if diff := cmp.Diff(want, kubectlBashtask(t, ns, "wait", "five"), cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("wait on an exit-5 task (-want +got):\n%s", diff)
	}
	if got := kubectlBashtask(t, ns, "wait", "nosuch"); got.code != plugin.ExitPluginError || !strings.Contains(got.stderr, "not found") {
		t.Errorf("wait on a missing task: %+v; want %d and not found", got, plugin.ExitPluginError)
	}
}

func TestRunInterruptCancelsTheTask(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	interrupts := make(chan os.Signal, 2)
	done := make(chan result, 1)
	go func() {
		done <- invocation{interrupts: interrupts}.run(t, ns, "run", "--name", "intr", "--", "echo started; sleep 60")
	}()
	testutil.WaitFor(t, "the task runs", 30*time.Second, testutil.Check(func() bool {
		bt := &bashtaskv1alpha1.BashTask{}
		return rig.Client.Get(t.Context(), objectKey(ns, "intr"), bt) == nil && ptr.Deref(bt.Status.Phase, "") == bashtaskv1alpha1.PhaseRunning
	}, nil))
	interrupts <- os.Interrupt
	got := <-done
	if got.code != exitOf(getTask(t, ns, "intr")) || got.stdout != "started\n" || !strings.Contains(got.stderr, "cancelling task") || !strings.Contains(got.stderr, "ended Cancelled") {
		t.Errorf("run interrupted once: %+v; want the exit code, the output so far and Cancelled", got)
	}
	if bt := getTask(t, ns, "intr"); bt.Spec.CancelRequested == nil || !*bt.Spec.CancelRequested {
		t.Errorf("spec.cancelRequested is not set after an interrupt")
	}
}

func TestRunRm(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	if got := kubectlBashtask(t, ns, "run", "--rm", "--name", "gone", "--", "echo hi"); got.code != 0 || got.stdout != "hi\n" {
		t.Fatalf("run --rm: %+v", got)
	}
	testutil.WaitFor(t, "the task is deleted", 30*time.Second, testutil.Check(func() bool {
		err := rig.Client.Get(t.Context(), objectKey(ns, "gone"), &bashtaskv1alpha1.BashTask{})
		return apierrors.IsNotFound(err)
	}, nil))
}

func TestGetOwner(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	for _, owner := range []string{"alice", "alice", "bob"} {
		if got := kubectlBashtask(t, ns, "run", "--owner", owner, "--", "exit 2"); got.code != 2 {
			t.Fatalf("run --owner %s: %+v", owner, got)
		}
	}
	got := kubectlBashtask(t, ns, "get", "--owner", "alice")
	if got.code != 0 {
		t.Fatalf("get --owner: %+v", got)
	}
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	header := []string{"NAME", "PHASE", "REASON", "EXIT", "NODE", "OWNER", "DURATION", "AGE"}
	if diff := cmp.Diff(header, strings.Fields(lines[0])); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	if len(lines) != 3 {
		t.Fatalf("get --owner alice printed %d rows, want 2:\n%s", len(lines)-1, got.stdout)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if diff := cmp.Diff([]string{"Failed", "NonZeroExit", "2", "alice"}, []string{f[1], f[2], f[3], f[5]}); diff != "" {
			t.Errorf("row %q (-want +got):\n%s", l, diff)
		}
	}
	if got := kubectlBashtask(t, ns, "get", "--owner", "carol"); got.code != 0 || got.stdout != "" || !strings.Contains(got.stderr, "no tasks found") {
		t.Errorf("get --owner with no match: %+v", got)
	}
}

func sha256hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// exitOf is the exit status run and wait give for a task that did not end
// by exiting: its exit code when it has one (143 after SIGTERM), else 1.
func exitOf(bt *bashtaskv1alpha1.BashTask) int {
	if bt.Status.ExitCode != nil && *bt.Status.ExitCode > 0 {
		return int(*bt.Status.ExitCode)
	}
	return plugin.ExitFailure
}

// taskLines drops the plugin's own notes from a local stderr, leaving what
// the task wrote.
func taskLines(stderr string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if !strings.HasPrefix(l, "kubectl-bashtask: ") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// A cancel carries the UID of the task it was meant for: after the task
// is deleted and made again under its name, the API server refuses the
// cancel (client.ErrTaskReplaced) and the new task runs on. The plugin's Ctrl-C
// and `cancel` go through this call (client.Cancel).
func TestCancelByUIDSparesARecreatedTask(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	oc, err := btclient.New(rig.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mk := func() *bashtaskv1alpha1.BashTask {
		bt := &bashtaskv1alpha1.BashTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again"},
			Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "sleep 60", KillGracePeriodSeconds: ptr.To[int32](0)},
		}
		if err := rig.Client.Create(t.Context(), bt); err != nil {
			t.Fatal(err)
		}
		return bt
	}
	first := mk()
	if err := rig.Client.Delete(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the first task is gone", 30*time.Second, func() error {
		err := rig.Client.Get(t.Context(), objectKey(ns, "again"), &bashtaskv1alpha1.BashTask{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err == nil:
			return errors.New("it still exists")
		}
		return fmt.Errorf("reading it: %w", err)
	})
	second := mk()
	if second.UID == first.UID {
		t.Fatalf("the re-created task has the first one's uid %s", first.UID)
	}

	err = oc.Cancel(t.Context(), ns, "again", first.UID)
	if !errors.Is(err, btclient.ErrTaskReplaced) {
		t.Errorf("cancel with the first task's uid: %v; want client.ErrTaskReplaced", err)
	}
	if got := getTask(t, ns, "again"); got.Spec.CancelRequested != nil {
		t.Errorf("the re-created task has spec.cancelRequested=%v after a cancel meant for the first one", *got.Spec.CancelRequested)
	}

	if err := oc.Cancel(t.Context(), ns, "again", second.UID); err != nil {
		t.Fatalf("cancel with the task's own uid: %v", err)
	}
	if got := getTask(t, ns, "again"); !ptr.Deref(got.Spec.CancelRequested, false) {
		t.Errorf("spec.cancelRequested is not set after a cancel with the task's own uid")
	}
}

// Like kubectl delete, cancel tries every name: a missing one is an error
// of its own and does not keep the names after it from being cancelled.
func TestCancelEveryName(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	for _, name := range []string{"c1", "c2"} {
		bt := &bashtaskv1alpha1.BashTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "sleep 60", KillGracePeriodSeconds: ptr.To[int32](0)},
		}
		if err := rig.Client.Create(t.Context(), bt); err != nil {
			t.Fatal(err)
		}
	}
	got := kubectlBashtask(t, ns, "cancel", "c1", "nosuch", "c2")
	// docs/kubectl-plugin.md: get, logs and cancel exit 1 on any error.
	if got.code != 1 || !strings.Contains(got.stderr, "nosuch") || !strings.Contains(got.stderr, "not found") {
		t.Errorf("cancel c1 nosuch c2: exit %d, stderr %q; want 1 naming nosuch as not found", got.code, got.stderr)
	}
	want := "bashtask.bashtask.dev/c1 cancel requested\nbashtask.bashtask.dev/c2 cancel requested\n"
	if got.stdout != want {
		t.Errorf("cancel c1 nosuch c2: stdout %q, want %q", got.stdout, want)
	}
	for _, name := range []string{"c1", "c2"} {
		if bt := getTask(t, ns, name); !ptr.Deref(bt.Spec.CancelRequested, false) {
			t.Errorf("%s: spec.cancelRequested is not set", name)
		}
	}
}
