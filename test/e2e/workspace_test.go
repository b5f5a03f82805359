package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// needWorkspaces skips at the process level: workspaces need the tenant
// level (a UID, a mount namespace, a network of their own).
func needWorkspaces(t *testing.T) {
	t.Helper()
	if isolation != v1.IsolationLevelTenant {
		t.Skipf("workspaces need the tenant isolation level; the agents run at %s", isolation)
	}
}

// createWorkspace creates a workspace through the plugin, which waits
// until it is Ready.
func createWorkspace(t *testing.T, ns, name string, args ...string) *v1.BashWorkspace {
	t.Helper()
	out, errOut, code := plugin(t.Context(), "", append([]string{"-n", ns, "workspace", "create", name}, args...)...)
	if code != 0 {
		t.Fatalf("workspace create %s: exit %d\nstdout: %s\nstderr: %s", name, code, out, errOut)
	}
	t.Cleanup(func() {
		// Deleted through the plugin, which waits until it is gone: the
		// deletion path runs in every test that makes one.
		if out, errOut, code := plugin(context.Background(), "", "-n", ns, "workspace", "delete", name); code != 0 {
			t.Errorf("workspace delete %s: exit %d\nstdout: %s\nstderr: %s", name, code, out, errOut)
		}
	})
	var ws v1.BashWorkspace
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &ws); err != nil {
		t.Fatal(err)
	}
	return &ws
}

// TestWorkspaceSession runs the commands of one session through the
// plugin: files, the working directory and exported variables carry from
// one task to the next, and a task of another owner is refused.
func TestWorkspaceSession(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "s1", "--owner", "o1", "--carry-env", "--network", "None")
	run := func(cmd string) (string, string, int) {
		return plugin(t.Context(), "", "-n", ns, "run", "--workspace", "s1", "--owner", "o1", "--", cmd)
	}
	if out, errOut, code := run(`echo hi > a.txt && mkdir -p sub && cd sub && export FOO=bar`); code != 0 {
		t.Fatalf("first task: exit %d: %s %s", code, out, errOut)
	}
	out, errOut, code := run(`pwd; cat ../a.txt; echo "FOO=$FOO HOME=$HOME"; whoami`)
	if code != 0 {
		t.Fatalf("second task: exit %d: %s %s", code, out, errOut)
	}
	want := "/home/task/sub\nhi\nFOO=bar HOME=/home/task\ntask\n"
	if out != want {
		t.Errorf("second task printed %q, want %q", out, want)
	}

	_, errOut, code = plugin(t.Context(), "", "-n", ns, "run", "--workspace", "s1", "--owner", "other", "--", "cat a.txt")
	if code == 0 || !strings.Contains(errOut, "o1") || !strings.Contains(errOut, "other") {
		t.Errorf("a task of owner other in workspace of o1: exit %d, stderr %q; want a refusal naming both owners", code, errOut)
	}
}

// TestWorkspaceGitOpsOrder applies a task before the workspace it names:
// the task waits Pending, with a condition naming the workspace, and runs
// once the workspace is Ready.
func TestWorkspaceGitOpsOrder(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	bt := &v1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "early"},
		Spec:       v1.BashTaskSpec{Command: "pwd", Workspace: ptr.To("later")},
	}
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), bt); err != nil {
			t.Fatal(err)
		}
		if c := findCondition(bt.Status.Conditions, v1.ConditionScheduled); c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "later") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task naming a missing workspace has no Scheduled=False condition naming it: %+v", bt.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ptr.Deref(bt.Status.Phase, "") != v1.PhasePending {
		t.Fatalf("phase %v, want Pending", ptr.Deref(bt.Status.Phase, ""))
	}
	createWorkspace(t, ns, "later", "--network", "None")
	done := testutil.WaitTerminal(t, k8s, ns, []string{"early"}, time.Minute)["early"]
	if ptr.Deref(done.Status.Reason, "") != v1.ReasonSucceeded || ptr.Deref(done.Status.Stdout.Tail, "") != "/home/task\n" {
		t.Errorf("the early task ended %v with stdout %q, want Succeeded and /home/task", ptr.Deref(done.Status.Reason, ""), ptr.Deref(done.Status.Stdout.Tail, ""))
	}
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

// tmux drives a real terminal: a private tmux server with one session.
type tmux struct {
	t      *testing.T
	socket string
}

func startTmux(t *testing.T, command string) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is needed for the terminal tests (make test installs it): %v", err)
	}
	tm := &tmux{t: t, socket: filepath.Join(t.TempDir(), "tmux.sock")}
	tm.run("new-session", "-d", "-s", "t", "-x", "160", "-y", "50", command)
	t.Cleanup(func() { _ = exec.Command("tmux", "-S", tm.socket, "kill-server").Run() })
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// send types keys into the terminal ("Enter", "C-c", "C-d" are keys).
func (tm *tmux) send(keys ...string) { tm.run(append([]string{"send-keys", "-t", "t"}, keys...)...) }

func (tm *tmux) screen() string { return tm.run("capture-pane", "-p", "-t", "t", "-S", "-200") }

// waitFor waits until the screen shows want, at most 60 s. The screen
// has no trailing blanks (capture-pane drops them).
func (tm *tmux) waitFor(want string) string { return tm.waitForN(want, 1) }

// waitForN waits until the screen shows want at least n times (a prompt
// printed again), at most 60 s.
func (tm *tmux) waitForN(want string, n int) string {
	tm.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := tm.screen()
		if strings.Count(s, want) >= n {
			return s
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("the terminal does not show %q %d times after 60 s:\n%s", want, n, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorkspaceShellInTmux uses `kubectl bashtask shell` from a real
// terminal: each line runs as a task of the workspace, the prompt shows
// the carried directory, output arrives while the line runs, a failing
// line shows its exit code, Ctrl-C cancels a running line, and Ctrl-D
// leaves.
func TestWorkspaceShellInTmux(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "sh1", "--network", "None")
	status := filepath.Join(t.TempDir(), "status")
	cmd := fmt.Sprintf("env KUBECONFIG=%s %s -n %s shell --line-mode sh1; echo $? > %s; sleep 30",
		filepath.Join(clusterDir, "kubeconfig"), filepath.Join(binDir, "kubectl-bashtask"), ns, status)
	tm := startTmux(t, cmd)
	const prompt = "sh1:~/proj/src$"
	tm.waitFor("sh1:~$")
	tm.send("mkdir -p proj/src && cd proj/src && echo made", "Enter")
	tm.waitFor("made")
	tm.waitForN(prompt, 1)
	tm.send("pwd; false", "Enter")
	s := tm.waitFor("exit 1")
	tm.waitForN(prompt, 2)
	if !strings.Contains(s, "/home/task/proj/src") {
		t.Errorf("pwd in the carried directory did not print /home/task/proj/src:\n%s", s)
	}
	// Output arrives while the line runs.
	tm.send("echo first; sleep 30; echo never", "Enter")
	tm.waitFor("first")
	tm.send("C-c")
	s = tm.waitFor("Cancelled")
	if strings.Count(s, "never") > 1 { // once in the typed line
		t.Errorf("the cancelled line went on:\n%s", s)
	}
	tm.waitForN(prompt, 3)
	tm.send("C-d")
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(status)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			// The last line was cancelled: the shell leaves with its status.
			if got := strings.TrimSpace(string(b)); got == "0" {
				t.Errorf("shell exit status %s after a cancelled last line, want non-zero", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shell did not exit on Ctrl-D:\n%s", tm.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
	var list v1.BashTaskList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 {
		t.Errorf("the shell made %d tasks, want one per line (3)", len(list.Items))
	}
}
