//go:build linux

package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/exampletasks"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// newNamespace creates a namespace for one test and deletes it after.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cluster-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// newTask creates a task with the command in ns.
func newTask(t *testing.T, ns, name, command string) *v1.BashTask {
	t.Helper()
	bt := &v1.BashTask{}
	bt.Namespace, bt.Name = ns, name
	bt.Spec.Command = command
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatalf("creating task %s: %v", name, err)
	}
	return bt
}

// waitTaskUntil polls the task until ok returns true for it (what names
// the state awaited). Named apart from testutil.WaitTerminal: it waits for
// any state of one task, not for tasks to end.
func waitTaskUntil(t *testing.T, ns, name, what string, timeout time.Duration, ok func(*v1.BashTask) bool) *v1.BashTask {
	t.Helper()
	var got *v1.BashTask
	testutil.WaitFor(t, fmt.Sprintf("%s/%s %s", ns, name, what), timeout, func() error {
		bt := &v1.BashTask{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, bt); err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if !ok(bt) {
			return fmt.Errorf("status %+v", bt.Status)
		}
		got = bt
		return nil
	})
	return got
}

// plugin runs kubectl-bashtask against the cluster.
func plugin(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
	return exampletasks.RunPlugin(ctx, filepath.Join(root, "bin", "kubectl-bashtask"), cluster.Kubeconfig(), nil, stdin, args...)
}

// kubectl runs the cluster's kubectl and fails the test on error.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cluster.Kubectl(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// helm runs helm against the cluster and fails the test on error.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cluster.Run(t.Context(), filepath.Join(root, "bin", "helm"), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// processesMatching lists the node's processes that belong to the
// cluster's pods (a kubepods cgroup: other programs on the host may run
// the same command) and whose command line (NULs as spaces, trailing space
// trimmed) is exactly cmdline.
func processesMatching(cmdline string) []int {
	var pids []int
	for _, pid := range procfs.PIDs() {
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(dir, "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/kubepods") {
			continue
		}
		if strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")) == cmdline {
			if st, err := procfs.ReadStat(pid); err == nil && st.State != 'Z' {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// waitNoProcess waits until no process on the node has the command line.
func waitNoProcess(t *testing.T, cmdline string, timeout time.Duration) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("no process %q on the node", cmdline), timeout, func() error {
		if pids := processesMatching(cmdline); len(pids) > 0 {
			return fmt.Errorf("still runs: pids %v", pids)
		}
		return nil
	})
}

// countingCommand reports one execution of its task to the suite's
// counter on the node's address, then runs rest.
func countingCommand(rest string) string { return counter.Command(rest) }

// countRuns returns how many times each task UID's counting command ran.
func countRuns(*testing.T) map[string]int { return counter.Runs() }

// agentPod returns the running agent pod's name.
func agentPod(t *testing.T) string {
	t.Helper()
	return podOf(t, "agent")
}

// podOf returns the name of the one running, not terminating pod of the
// release's component (waiting a minute for it).
func podOf(t *testing.T, component string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		pods, err := cs.CoreV1().Pods(releaseNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				names = append(names, p.Name)
			}
		}
		if len(names) == 1 {
			return names[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("want one running %s pod, have %v", component, names)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// objectFile is where the file bucket (file://<stateDir>/uploads, the
// chart's default, on the node's hostPath) keeps a stream.
func objectFile(bt *v1.BashTask, stream string) string {
	return filepath.Join("/var/lib/bashtask-agent/uploads", bt.Namespace, bt.Name, string(bt.UID), stream)
}

// taskDir is the agent's directory of a task it holds (its spill files),
// under the chart's stateDir on the node's hostPath.
func taskDir(bt *v1.BashTask) string {
	return filepath.Join("/var/lib/bashtask-agent/tasks", string(bt.UID))
}

// waitForgotten waits until the agent has forgotten the finished task (its
// directory is gone): its output is then only in the bucket.
func waitForgotten(t *testing.T, bt *v1.BashTask) {
	t.Helper()
	testutil.WaitFor(t, "the agent forgets the finished task", 2*time.Minute, func() error {
		_, err := os.Stat(taskDir(bt))
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil
		case err != nil:
			return err
		}
		return fmt.Errorf("%s is still there", taskDir(bt))
	})
}

// checkObject checks the stored stream against the status's size and
// sha256.
func checkObject(t *testing.T, bt *v1.BashTask, stream string, s *v1.StreamStatus) {
	t.Helper()
	if s == nil || s.Spill == nil {
		t.Fatalf("%s: no %s spill reference in status: %+v", bt.Name, stream, s)
	}
	data, err := os.ReadFile(objectFile(bt, stream))
	if err != nil {
		t.Fatalf("%s: reading the stored %s: %v", bt.Name, stream, err)
	}
	sum := sha256.Sum256(data)
	if int64(len(data)) != ptr.Deref(s.TotalBytes, 0) || hex.EncodeToString(sum[:]) != ptr.Deref(s.SHA256, "") {
		t.Errorf("%s: stored %s has %d bytes sha256 %x; status says %d bytes sha256 %s", bt.Name, stream, len(data), sum, ptr.Deref(s.TotalBytes, 0), ptr.Deref(s.SHA256, ""))
	}
}

func describe(bt *v1.BashTask) string {
	return fmt.Sprintf("%s: phase %s reason %s (%s) exit %v", bt.Name, ptr.Deref(bt.Status.Phase, ""), ptr.Deref(bt.Status.Reason, ""), ptr.Deref(bt.Status.Message, ""), ptr.Deref(bt.Status.ExitCode, -1))
}

// firstLine returns the first line of s that contains substr, or "" when
// none does.
func firstLine(s, substr string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			return strings.TrimSuffix(line, "\n")
		}
	}
	return ""
}
