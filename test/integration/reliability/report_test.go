package reliability_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

const fullTail = 64000

// TestFullTailsSurviveRestart runs 150 tasks on one agent, each with a full
// 64000-byte tail on both streams, restarts the controller while they run,
// and checks that the new controller's report from the agent (one message
// per task on its Watch stream) arrives without any stream ending in
// ResourceExhausted, that it follows every task, and that every task ends
// Succeeded with both tails whole.
func TestFullTailsSurviveRestart(t *testing.T) {
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tails-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fifo, release := filepath.Join(dir, "idle"), filepath.Join(dir, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// The tasks wait without forking: a read with a timeout on a FIFO
	// opened read-write never sees data or EOF.
	command := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' o; head -c %d /dev/zero | tr '\0' e >&2
exec 3<>%q; until [ -e %q ]; do read -t 1 -u 3 _; done; exit 0`, fullTail, fullTail, fifo, release)
	tasks := make([]*v1.BashTask, manyTasks)
	for i := range tasks {
		bt := &v1.BashTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("tails-%03d", i)},
			Spec: v1.BashTaskSpec{Command: command, NodeName: ptr.To("node-a"),
				TimeoutSeconds: ptr.To[int32](300), KillGracePeriodSeconds: ptr.To[int32](1)},
		}
		if err := k8s.Create(ctx, bt); err != nil {
			t.Fatal(err)
		}
		tasks[i] = bt
	}
	// Every task runs with both tails full in its status.
	waitAll(t, ns.Name, 3*time.Minute, func(bt *v1.BashTask) bool {
		st := bt.Status
		return ptr.Deref(st.Phase, "") == v1.PhaseRunning && st.Stdout != nil && st.Stderr != nil &&
			len(ptr.Deref(st.Stdout.Tail, "")) == fullTail && len(ptr.Deref(st.Stderr.Tail, "")) == fullTail
	})
	exhausted := func() float64 {
		return testutil.ToFloat64(rig.Registry.StreamEnds.WithLabelValues(codes.ResourceExhausted.String()))
	}
	if n := exhausted(); n != 0 {
		t.Errorf("%v Watch streams ended with ResourceExhausted before the restart", n)
	}

	if err := rig.RestartController(); err != nil {
		t.Fatalf("restarting the controller: %v", err)
	}
	// The new controller's Watch stream reports every task again (a
	// bound for a loaded machine: completeness is the point, not speed).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		held := 0
		for _, bt := range tasks {
			if rig.Registry.Holds("node-a", string(getTask(t, bt).UID)) {
				held++
			}
		}
		if held == manyTasks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the controller sees %d of %d tasks on the agent", held, manyTasks)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := exhausted(); n != 0 {
		t.Errorf("%v Watch streams ended with ResourceExhausted after the restart", n)
	}

	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitAll(t, ns.Name, 3*time.Minute, func(bt *v1.BashTask) bool { return bt.Status.Reason != nil })
	var list v1.BashTaskList
	if err := k8s.List(ctx, &list, client.InNamespace(ns.Name)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		st := &list.Items[i].Status
		if ptr.Deref(st.Reason, "") != v1.ReasonSucceeded || ptr.Deref(st.Stdout.TotalBytes, 0) != fullTail ||
			ptr.Deref(st.Stdout.Tail, "") != strings.Repeat("o", fullTail) || ptr.Deref(st.Stderr.Tail, "") != strings.Repeat("e", fullTail) {
			t.Errorf("%s: reason %s, stdout %d bytes, tails %d and %d bytes; want Succeeded with both tails whole",
				list.Items[i].Name, ptr.Deref(st.Reason, ""), ptr.Deref(st.Stdout.TotalBytes, 0), len(ptr.Deref(st.Stdout.Tail, "")), len(ptr.Deref(st.Stderr.Tail, "")))
		}
	}
	if n := exhausted(); n != 0 {
		t.Errorf("%v Watch streams ended with ResourceExhausted", n)
	}
}

func getTask(t *testing.T, bt *v1.BashTask) *v1.BashTask {
	t.Helper()
	out := &v1.BashTask{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(bt), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitAll waits until ok holds for every task of the namespace.
func waitAll(t *testing.T, ns string, timeout time.Duration, ok func(*v1.BashTask) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var list v1.BashTaskList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for i := range list.Items {
			if ok(&list.Items[i]) {
				n++
			}
		}
		if n == len(list.Items) && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s only %d of %d tasks are as expected", timeout, n, len(list.Items))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
