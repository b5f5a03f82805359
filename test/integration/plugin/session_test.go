package plugin_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
)

// timedWriter keeps what is written and when each write came.
type timedWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes []timedWrite
}

type timedWrite struct {
	at   time.Time
	text string
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, timedWrite{time.Now(), string(p)})
	return w.buf.Write(p)
}

// first returns when the first write containing s came.
func (w *timedWriter) first(s string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wr := range w.writes {
		if strings.Contains(wr.text, s) {
			return wr.at, true
		}
	}
	return time.Time{}, false
}

func (w *timedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func createWorkspaceObject(t *testing.T, ns, name string, spec bashtaskv1alpha1.BashWorkspaceSpec) {
	t.Helper()
	ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	if err := rig.Client.Create(t.Context(), ws); err != nil {
		t.Fatalf("creating workspace %s: %v", name, err)
	}
}

func taskCount(t *testing.T, ns string) int {
	t.Helper()
	var list bashtaskv1alpha1.BashTaskList
	if err := rig.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// TestRunRefusesAMissingOrHeldWorkspaceAtOnce: run -w W for a W that does
// not exist, or that spec.suspend holds, fails at once with a message
// naming W and what to do, and creates no task; it used to wait silently.
func TestRunRefusesAMissingOrHeldWorkspaceAtOnce(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createWorkspaceObject(t, ns, "held", bashtaskv1alpha1.BashWorkspaceSpec{Suspend: ptr.To(true)})
	for _, tc := range []struct {
		workspace string
		want      []string
	}{
		{"nosuch", []string{`"nosuch" not found in namespace ` + ns, "kubectl bashtask workspace create -n " + ns + " nosuch"}},
		{"held", []string{`"held" is held`, "spec.suspend is true", "kubectl bashtask workspace resume -n " + ns + " held"}},
	} {
		start := time.Now()
		got := invocation{timeout: 20 * time.Second}.run(t, ns, "run", "-w", tc.workspace, "--", "true")
		took := time.Since(start)
		if got.code != plugin.ExitPluginError || took > 5*time.Second {
			t.Errorf("run -w %s: exit %d after %v, stderr %q; want exit %d at once", tc.workspace, got.code, took, got.stderr, plugin.ExitPluginError)
		}
		for _, w := range tc.want {
			if !strings.Contains(got.stderr, w) {
				t.Errorf("run -w %s: stderr %q does not say %q", tc.workspace, got.stderr, w)
			}
		}
	}
	if n := taskCount(t, ns); n != 0 {
		t.Errorf("%d tasks were created for workspaces that take none", n)
	}
}

// TestRunSaysWhyItWaitsAndBoundsTheWait: a task whose workspace is not
// Ready (the rig's agents run at the process level, where no workspace is
// made) waits; run says why on stderr within 2 s, takes the workspace's
// owner, and --wait-timeout ends the wait: the task is cancelled and run
// exits 124 saying how long it waited and in what state the task was.
func TestRunSaysWhyItWaitsAndBoundsTheWait(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createWorkspaceObject(t, ns, "pending", bashtaskv1alpha1.BashWorkspaceSpec{Owner: ptr.To("o1")})
	errOut := &timedWriter{}
	start := time.Now()
	got := invocation{stderr: errOut, timeout: 30 * time.Second}.run(t, ns, "run", "--name", "w1", "-w", "pending", "--wait-timeout", "4s", "--", "true")
	took := time.Since(start)
	stderr := errOut.String()
	at, ok := errOut.first("is not running yet: WorkspaceNotReady")
	if !ok {
		t.Errorf("run said nothing of why the task waits; stderr %q", stderr)
	} else if d := at.Sub(start); d > 2*time.Second {
		t.Errorf("run said why the task waits %v after it started, want within 2s; stderr %q", d, stderr)
	}
	if strings.Count(stderr, "WorkspaceNotReady:") > 2 {
		t.Errorf("the reason was noted more than once (the timeout's message aside): %q", stderr)
	}
	if got.code != plugin.ExitWaitTimeout || took > 15*time.Second {
		t.Errorf("run --wait-timeout 4s: exit %d after %v; want %d after about 4s", got.code, took, plugin.ExitWaitTimeout)
	}
	for _, w := range []string{"did not end within --wait-timeout 4s", "waited 4", "still Pending", "asked to cancel"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr %q does not say %q", stderr, w)
		}
	}
	bt := getTask(t, ns, "w1")
	if !ptr.Deref(bt.Spec.CancelRequested, false) {
		t.Errorf("the task was not cancelled when the wait bound passed")
	}
	if owner := ptr.Deref(bt.Spec.Owner, ""); owner != "o1" {
		t.Errorf("spec.owner %q, want the workspace's owner o1", owner)
	}
}

// TestRunDetach: --detach prints the task's name, says how to read and
// stop it, and exits 0 at once; the task runs on and its output is read
// later with logs.
func TestRunDetach(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	start := time.Now()
	got := kubectlBashtask(t, ns, "run", "--detach", "--name", "bg", "--", "echo one; sleep 2; echo two")
	if got.code != 0 || got.stdout != "bg\n" || time.Since(start) > 2*time.Second {
		t.Fatalf("run --detach: %+v after %v; want exit 0 and the name at once", got, time.Since(start))
	}
	for _, w := range []string{"kubectl bashtask logs -n " + ns + " bg -f", "kubectl bashtask cancel -n " + ns + " bg"} {
		if !strings.Contains(got.stderr, w) {
			t.Errorf("run --detach: stderr %q does not say %q", got.stderr, w)
		}
	}
	if logs := kubectlBashtask(t, ns, "logs", "-f", "bg"); logs.code != 0 || logs.stdout != "one\ntwo\n" {
		t.Errorf("logs -f of the detached task: %+v", logs)
	}
	for _, args := range [][]string{{"--rm"}, {"-i", "--stream"}, {"--wait-timeout", "1m"}} {
		got := kubectlBashtask(t, ns, append(append([]string{"run", "--detach"}, args...), "--", "true")...)
		if got.code != plugin.ExitPluginError || !strings.Contains(got.stderr, "--detach and") {
			t.Errorf("run --detach %s: %+v; want a refusal naming both flags", args, got)
		}
	}
}

// TestRunTTL: the tasks run makes are deleted an hour after their end
// unless --ttl says otherwise; --ttl 0 leaves the field unset (the
// controller's default TTL).
func TestRunTTL(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	for _, tc := range []struct {
		name string
		args []string
		want *int32
	}{
		{"default", nil, ptr.To[int32](3600)},
		{"ninety", []string{"--ttl", "90s"}, ptr.To[int32](90)},
		{"kept", []string{"--ttl", "0"}, nil},
	} {
		args := append(append([]string{"run", "--detach", "--name", tc.name}, tc.args...), "--", "true")
		if got := kubectlBashtask(t, ns, args...); got.code != 0 {
			t.Fatalf("run %q: %+v", args, got)
		}
		if ttl := getTask(t, ns, tc.name).Spec.TTLSecondsAfterFinished; !ptr.Equal(ttl, tc.want) {
			t.Errorf("run %q: spec.ttlSecondsAfterFinished %v, want %v", tc.args, ptr.Deref(ttl, -1), ptr.Deref(tc.want, -1))
		}
	}
}

// TestRunNotesLeftoverProcesses: a background process the command left
// is stopped with it, and run says so, pointing to --detach.
func TestRunNotesLeftoverProcesses(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	got := kubectlBashtask(t, ns, "run", "--name", "bg", "--", "sleep 30 & echo started")
	if got.code != 0 || got.stdout != "started\n" {
		t.Fatalf("run: %+v", got)
	}
	n := ptr.Deref(getTask(t, ns, "bg").Status.LeftoverProcesses, 0)
	if n < 1 {
		t.Fatalf("status.leftoverProcesses %d, want at least 1", n)
	}
	for _, w := range []string{"the command left", "--detach"} {
		if !strings.Contains(got.stderr, w) {
			t.Errorf("stderr %q does not say %q", got.stderr, w)
		}
	}
}
