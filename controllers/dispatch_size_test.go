package controllers_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/executor"
)

// TestEnvOverTheAgentsLimitIsInvalidSpec gives a task 56 environment
// entries of 120000 bytes from Secrets (6.7 MB, over execve's limit on any
// node, 6 MiB at most) and 200 KB of stdin: the controller refuses it
// before dispatch, with reason InvalidSpec and a message that gives the
// size and the limit the agent reported, and no agent ever hears of it.
func TestEnvOverTheAgentsLimitIsInvalidSpec(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const secrets, perSecret, valueBytes = 7, 8, 120000
	var env []v1.EnvVar
	for s := range secrets {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("big-%d", s)}, Data: map[string][]byte{}}
		for k := range perSecret {
			key := fmt.Sprintf("v%d", k)
			sec.Data[key] = []byte(strings.Repeat(strconv.Itoa(k), valueBytes))
			env = append(env, v1.EnvVar{Name: fmt.Sprintf("BIG_%d_%d", s, k), ValueFrom: &v1.ValueSource{
				SecretKeyRef: &v1.KeySelector{Name: sec.Name, Key: key},
			}})
		}
		if err := k8s.Create(t.Context(), sec); err != nil {
			t.Fatal(err)
		}
	}
	bt := newTask(ns, "too-much-env", "echo never", func(bt *v1.BashTask) {
		bt.Spec.Env = env
		bt.Spec.Stdin = ptr.To(strings.Repeat("s", 200000))
		bt.Spec.NodeName = ptr.To("node-a")
	})
	// How soon the refusal comes is not asserted here (a wall-clock bound
	// fails on a busy machine, not on a slow controller); that it comes
	// before any dispatch is, below.
	create(t, bt)
	got := waitTerminal(t, bt)
	if r := ptr.Deref(got.Status.Reason, ""); r != v1.ReasonInvalidSpec {
		t.Fatalf("reason %s (%s), want InvalidSpec", r, ptr.Deref(got.Status.Message, ""))
	}
	msg := ptr.Deref(got.Status.Message, "")
	t.Logf("message: %s", msg)
	// The agents of the rig run in this process, so they report this
	// process's limit.
	limit := executor.CurrentArgEnvLimit()
	for _, want := range []string{
		fmt.Sprintf("over the limit of %d bytes", limit),
		"ARG_MAX",
		"node node-a",
		fmt.Sprintf("(%d entries)", secrets*perSecret+4),
		fmt.Sprintf("(%d bytes)", len("BIG_0_0")+1+valueBytes),
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	var size int64
	if _, err := fmt.Sscanf(msg[strings.Index(msg, "take ")+len("take "):], "%d", &size); err != nil || size <= limit || size < secrets*perSecret*valueBytes {
		t.Errorf("message %q: size %d, want the measured size over %d", msg, size, limit)
	}
	if got.Status.NodeName != nil || got.Status.StartTime != nil {
		t.Errorf("the task was dispatched: node %v, start %v", got.Status.NodeName, got.Status.StartTime)
	}
	if rig.Registry.Holds("node-a", string(got.UID)) {
		t.Error("the agent holds the refused task")
	}
}
