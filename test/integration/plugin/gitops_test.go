package plugin_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// TestDeletedWhileFollowed checks the one rule for run, wait and logs -f
// (C40): a task deleted while it is followed gives exit status 125 and a
// message that says it was deleted and, if it did, how it ended. A running
// task ends Cancelled on its way out; a pending one never ends.
func TestDeletedWhileFollowed(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		args      []string // the plugin's command; the task is named after the case
		create    bool     // create the task first (run creates its own)
		suspended bool     // created suspended, so it stays pending
		wantEnd   string
	}{
		"wait, running":    {args: []string{"wait"}, create: true, wantEnd: "; it ended Cancelled (exit code 143)"},
		"wait, pending":    {args: []string{"wait"}, create: true, suspended: true, wantEnd: ", before it ended"},
		"logs -f, running": {args: []string{"logs", "-f"}, create: true, wantEnd: "; it ended Cancelled (exit code 143)"},
		"logs -f, pending": {args: []string{"logs", "-f"}, create: true, suspended: true, wantEnd: ", before it ended"},
		"run, running":     {args: []string{"run", "--name"}, wantEnd: "; it ended Cancelled (exit code 143)"},
	}
	i := 0
	for name, tc := range tests {
		i++
		task := fmt.Sprintf("deleted-%d", i)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if tc.create {
				bt := &bashtaskv1alpha1.BashTask{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: task},
					Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "echo started; sleep 60", KillGracePeriodSeconds: ptr.To[int32](1)},
				}
				if tc.suspended {
					bt.Spec.Suspend = ptr.To(true)
				}
				if err := rig.Client.Create(t.Context(), bt); err != nil {
					t.Fatal(err)
				}
			}
			args := append(append([]string{}, tc.args...), task)
			if !tc.create {
				args = append(args, "--", "echo started; sleep 60")
			}
			done := make(chan result, 1)
			go func() { done <- kubectlBashtask(t, ns, args...) }()
			testutil.WaitFor(t, "the task is followed in the state to delete it in", 30*time.Second, testutil.Check(func() bool {
				bt := &bashtaskv1alpha1.BashTask{}
				if rig.Client.Get(t.Context(), objectKey(ns, task), bt) != nil {
					return false
				}
				if tc.suspended {
					return bt.Status.Phase != nil
				}
				return ptr.Deref(bt.Status.Phase, "") == bashtaskv1alpha1.PhaseRunning
			}, nil))
			// Give the plugin time to be following (it reads, then
			// watches), as a user deleting a task from another terminal:
			// a task deleted before the plugin first read it is a task
			// that does not exist, a different error.
			time.Sleep(time.Second)
			if err := rig.Client.Delete(t.Context(), &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: task}}); err != nil {
				t.Fatal(err)
			}
			got := <-done
			want := fmt.Sprintf("task %s/%s was deleted while it was followed%s", ns, task, tc.wantEnd)
			if got.code != plugin.ExitPluginError || !strings.Contains(got.stderr, want) {
				t.Errorf("%v: code %d, stderr %q; want %d and %q", args, got.code, got.stderr, plugin.ExitPluginError, want)
			}
		})
	}
}

// TestKubectlWaitAnyOutcome checks the one kubectl wait command
// docs/gitops.md gives for "finished, whatever the outcome": it returns
// within about a second of the end for every outcome: success, a non-zero
// exit, a timeout, a signal, a start failure and a cancel.
func TestKubectlWaitAnyOutcome(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		spec        bashtaskv1alpha1.BashTaskSpec
		cancelAfter time.Duration // set spec.cancelRequested this long after creation
		wantReason  bashtaskv1alpha1.Reason
	}{
		"cancelled":   {spec: bashtaskv1alpha1.BashTaskSpec{Command: "sleep 30", KillGracePeriodSeconds: ptr.To[int32](0)}, cancelAfter: 2 * time.Second, wantReason: bashtaskv1alpha1.ReasonCancelled},
		"succeeded":   {spec: bashtaskv1alpha1.BashTaskSpec{Command: "sleep 2"}, wantReason: bashtaskv1alpha1.ReasonSucceeded},
		"non-zero":    {spec: bashtaskv1alpha1.BashTaskSpec{Command: "sleep 2; exit 3"}, wantReason: bashtaskv1alpha1.ReasonNonZeroExit},
		"timed out":   {spec: bashtaskv1alpha1.BashTaskSpec{Command: "sleep 30", TimeoutSeconds: ptr.To[int32](2), KillGracePeriodSeconds: ptr.To[int32](0)}, wantReason: bashtaskv1alpha1.ReasonTimedOut},
		"signaled":    {spec: bashtaskv1alpha1.BashTaskSpec{Command: "sleep 2; kill -KILL $$"}, wantReason: bashtaskv1alpha1.ReasonSignaled},
		"start fails": {spec: bashtaskv1alpha1.BashTaskSpec{Command: "true", WorkingDir: ptr.To("/does/not/exist")}, wantReason: bashtaskv1alpha1.ReasonStartFailed},
	}
	i := 0
	for name, tc := range tests {
		i++
		task := fmt.Sprintf("any-%d", i)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bt := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: task}, Spec: tc.spec}
			if err := rig.Client.Create(t.Context(), bt); err != nil {
				t.Fatal(err)
			}
			if tc.cancelAfter > 0 {
				time.AfterFunc(tc.cancelAfter, func() {
					patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancelRequested":true}}`))
					if err := rig.Client.Patch(t.Context(), bt, patch); err != nil {
						t.Errorf("cancelling: %v", err)
					}
				})
			}
			// Watch for the end from here, with the API's own resolution,
			// to compare with when kubectl wait returned.
			ended := make(chan time.Time, 1)
			go func() {
				for t.Context().Err() == nil {
					got := &bashtaskv1alpha1.BashTask{}
					if rig.Client.Get(t.Context(), objectKey(ns, task), got) == nil && got.Status.Reason != nil {
						ended <- time.Now()
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			// The documented command, as docs/gitops.md writes it.
			cmd := exec.CommandContext(t.Context(), filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"),
				"--kubeconfig", kubeconfig, "-n", ns, "wait", "bt/"+task, "--for=jsonpath={.status.reason}", "--timeout=60s")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("kubectl wait: %v: %s", err, out.String())
			}
			returned := time.Now()
			end := <-ended
			if lag := returned.Sub(end); lag > time.Second {
				t.Errorf("kubectl wait returned %s after the task ended", lag)
			}
			got := getTask(t, ns, task)
			if ptr.Deref(got.Status.Reason, "") != tc.wantReason {
				t.Errorf("reason %q, want %q", ptr.Deref(got.Status.Reason, ""), tc.wantReason)
			}
			if !strings.Contains(out.String(), "condition met") {
				t.Errorf("kubectl wait printed %q", out.String())
			}
		})
	}
}
