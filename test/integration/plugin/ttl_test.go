package plugin_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
	"github.com/bashtask/bashtask-operator/internal/taskrecord"
)

// runPastTTL creates a task with spec.ttlSecondsAfterFinished 0 and waits
// until the controller deleted it; it returns the task's UID.
func runPastTTL(t *testing.T, ns, name, command string) types.UID {
	t.Helper()
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Command: command, TTLSecondsAfterFinished: ptr.To[int32](0)},
	}
	if err := rig.Client.Create(t.Context(), bt); err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
	testutil.WaitFor(t, name+" deleted after its TTL", 60*time.Second, func() error {
		err := rig.Client.Get(t.Context(), objectKey(ns, name), &bashtaskv1alpha1.BashTask{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return errStillThere
	})
	return bt.UID
}

var errStillThere = errors.New("the task still exists")

// TestLogsAfterTTL: a task past its TTL is deleted, and its output still
// reads through the output API and the plugin's logs, from the record the
// controller kept in the output bucket: by name the task of that name
// deleted last, by --uid an earlier one; a UID never seen is a clear
// NotFound. The output is longer than the status tails, so it comes from
// the uploaded copies.
func TestLogsAfterTTL(t *testing.T) {
	ns := newNamespace(t)
	first := runPastTTL(t, ns, "past-ttl", "seq 1 30000; echo first-err >&2")
	if _, err := os.Stat(filepath.Join(rig.BucketDir, taskrecord.Key(ns, "past-ttl", first))); err != nil {
		t.Fatalf("the record of the deleted task: %v", err)
	}

	res := kubectlBashtask(t, ns, "logs", "past-ttl")
	if res.code != 0 || res.stdout != seqOutput(30000) {
		t.Fatalf("logs of the deleted task: exit %d, %d bytes of stdout (want %d), stderr %q", res.code, len(res.stdout), len(seqOutput(30000)), res.stderr)
	}
	res = kubectlBashtask(t, ns, "logs", "past-ttl", "--stderr")
	if res.code != 0 || res.stdout != "first-err\n" {
		t.Fatalf("logs --stderr of the deleted task: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}

	second := runPastTTL(t, ns, "past-ttl", "seq 1 5")
	res = kubectlBashtask(t, ns, "logs", "past-ttl")
	if res.code != 0 || res.stdout != seqOutput(5) {
		t.Fatalf("logs by name after a second task of the name: exit %d, stdout %q, stderr %q (want the newest, uid %s)", res.code, res.stdout, res.stderr, second)
	}
	res = kubectlBashtask(t, ns, "logs", "past-ttl", "--uid", string(first))
	if res.code != 0 || res.stdout != seqOutput(30000) {
		t.Fatalf("logs --uid %s: exit %d, %d bytes of stdout, stderr %q", first, res.code, len(res.stdout), res.stderr)
	}
	res = kubectlBashtask(t, ns, "logs", "past-ttl", "--uid", string(first), "--stream", "all")
	if res.code != 0 || res.stdout != seqOutput(30000) || res.stderr != "first-err\n" {
		t.Fatalf("logs --uid --stream all: exit %d, %d bytes of stdout, stderr %q", res.code, len(res.stdout), res.stderr)
	}
	res = kubectlBashtask(t, ns, "logs", "past-ttl", "--uid", "00000000-0000-0000-0000-000000000000")
	if res.code == 0 || !strings.Contains(res.stderr, "no task with uid 00000000-0000-0000-0000-000000000000") {
		t.Fatalf("logs --uid of no task: exit %d, stderr %q", res.code, res.stderr)
	}
}

// TestFinishedTaskKeptWithoutTTL: a finished task without
// ttlSecondsAfterFinished is kept under the controller's default TTL of an
// hour, while a task with TTL 0 that ended after it is already gone.
func TestFinishedTaskKeptWithoutTTL(t *testing.T) {
	ns := newNamespace(t)
	kept := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept"},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "echo kept"},
	}
	if err := rig.Client.Create(t.Context(), kept); err != nil {
		t.Fatalf("creating kept: %v", err)
	}
	testutil.WaitFor(t, "kept finished", 60*time.Second, testutil.Check(func() bool {
		return getTask(t, ns, "kept").Status.CompletionTime != nil
	}, nil))
	runPastTTL(t, ns, "gone", "echo gone")
	if bt := getTask(t, ns, "kept"); !bt.DeletionTimestamp.IsZero() {
		t.Fatalf("the task without a TTL is being deleted: %v", bt.DeletionTimestamp)
	}
}
