package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// interactiveBash is the command of the terminal tests: an interactive
// bash without start-up files, its prompt "$ " (a non-interactive bash
// does not pass PS1 on: env does).
const interactiveBash = "exec env PS1='" + prompt + " ' bash --norc --noprofile -i"

// prompt is interactiveBash's prompt, without the space that follows
// (tmux's capture drops a line's trailing blanks).
const prompt = "tty$"

func withTTY(bt *v1.BashTask) { bt.Spec.TTY = ptr.To(true) }

// sizes is a TerminalSizeQueue fed by the test.
type sizes chan client.WindowSize

func (s sizes) Next() *client.WindowSize {
	sz, ok := <-s
	if !ok {
		return nil
	}
	return &sz
}

// attached is one Attach of the Go client running in the background.
type attached struct {
	in     *io.PipeWriter
	out    *syncbuf.Buffer
	sizes  sizes
	cancel context.CancelFunc
	done   chan error
}

func attachTo(t *testing.T, c *client.Client, ns, name string) *attached {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	a := &attached{in: pw, out: &syncbuf.Buffer{}, sizes: make(sizes, 4), cancel: cancel, done: make(chan error, 1)}
	go func() {
		a.done <- c.Attach(ctx, ns, name, client.AttachOptions{Stdin: pr, Stdout: a.out, Sizes: a.sizes})
	}()
	t.Cleanup(func() { cancel(); _ = pw.Close() })
	return a
}

func (a *attached) typeIn(t *testing.T, s string) {
	t.Helper()
	if _, err := a.in.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func (a *attached) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(a.out.String(), want) {
		select {
		case err := <-a.done:
			t.Fatalf("attach ended (%v) before the terminal showed %q:\n%q", err, want, a.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal does not show %q after a minute:\n%q", want, a.out.String())
		}
	}
}

func (a *attached) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a.done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("attach did not end a minute after the task's end:\n%q", a.out.String())
		return nil
	}
}

// TestAttachThroughTheOutputAPI drives a task's terminal with the Go
// client through bashtasks/attach: typed input and a window size reach
// the program, ^C interrupts sleep in a shell that survives, a client
// that goes away leaves the task running, a second attach shows the
// recent screen and carries on, and the task's exit code comes back.
func TestAttachThroughTheOutputAPI(t *testing.T) {
	ns := newNamespace(t)
	bt := createTask(t, ns, "term", interactiveBash, withTTY)
	c := outputClient(t, adminConfig(t))
	a := attachTo(t, c, ns, bt.Name)
	a.sizes <- client.WindowSize{Width: 100, Height: 30}
	a.waitFor(t, prompt)
	a.typeIn(t, "echo size=$(tput cols)x$(tput lines)\r")
	a.waitFor(t, "size=100x30")
	a.typeIn(t, "sleep 300\r")
	time.Sleep(300 * time.Millisecond)
	a.typeIn(t, "\x03")
	a.typeIn(t, "echo status=$?\r")
	a.waitFor(t, "status=130")

	a.cancel() // the client goes away
	if err := a.end(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("a detach: %v, want context.Canceled", err)
	}
	time.Sleep(500 * time.Millisecond)
	var now v1.BashTask
	if err := k8s.Get(t.Context(), ctrlclient.ObjectKeyFromObject(bt), &now); err != nil || now.Status.Reason != nil {
		t.Fatalf("after the detach the task is %v (%v), want it running", now.Status.Reason, err)
	}

	b := attachTo(t, c, ns, bt.Name)
	b.waitFor(t, "status=130") // the recent screen
	b.typeIn(t, "echo again=$((40+2))\r")
	b.waitFor(t, "again=42")
	b.typeIn(t, "exit 7\r")
	var ee *client.AttachExitError
	if err := b.end(t); !errors.As(err, &ee) || ee.Code != 7 {
		t.Fatalf("the task's end: %v, want an AttachExitError with code 7", err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	if !strings.Contains(ptr.Deref(done.Status.Stdout.Tail, ""), "again=42") {
		t.Errorf("the terminal's output is not the task's stdout: %q", ptr.Deref(done.Status.Stdout.Tail, ""))
	}
}

// TestAttachRefusals: attach is refused, with a message naming why, to a
// task without a terminal, to one that has ended, and without create on
// bashtasks/attach; get on bashtasks/log grants none of it.
func TestAttachRefusals(t *testing.T) {
	ns := newNamespace(t)
	admin := outputClient(t, adminConfig(t))
	plain := createTask(t, ns, "plain", "sleep 60")
	err := admin.Attach(t.Context(), ns, plain.Name, client.AttachOptions{Stdout: io.Discard})
	if !isCode(err, http.StatusBadRequest) || !strings.Contains(err.Error(), "spec.tty") {
		t.Errorf("a task without a terminal: %v, want 400 naming spec.tty", err)
	}
	ended := createTask(t, ns, "ended", "exit 0", withTTY)
	testutil.WaitTerminal(t, k8s, ns, []string{ended.Name}, time.Minute)
	err = admin.Attach(t.Context(), ns, ended.Name, client.AttachOptions{Stdout: io.Discard})
	if !isCode(err, http.StatusGone) || !strings.Contains(err.Error(), "has ended") {
		t.Errorf("an ended task: %v, want 410 saying it has ended", err)
	}

	term := createTask(t, ns, "guarded", interactiveBash, withTTY)
	grant := func(user string, rules ...rbacv1.PolicyRule) *client.Client {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: rules}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		for _, o := range []ctrlclient.Object{role, rb} {
			if err := k8s.Create(t.Context(), o); err != nil {
				t.Fatal(err)
			}
		}
		cfg := adminConfig(t)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		return outputClient(t, cfg)
	}
	out := func(res ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: res, Verbs: []string{"get"}}
	}
	reader := grant("e2e-attach-reader", out("bashtasks/log"))
	getter := grant("e2e-attach-getter", out("bashtasks/attach"))
	attacher := grant("e2e-attach-user", rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/attach"}, Verbs: []string{"get", "create"}})
	for who, c := range map[string]*client.Client{"a log reader": reader, "get alone": getter} {
		if err := c.Attach(t.Context(), ns, term.Name, client.AttachOptions{Stdout: io.Discard}); !isCode(err, http.StatusForbidden) {
			t.Errorf("%s: %v, want 403", who, err)
		}
	}
	a := attachTo(t, attacher, ns, term.Name)
	a.waitFor(t, prompt)
	a.typeIn(t, "exit\r")
	if err := a.end(t); err != nil {
		t.Fatalf("get and create on bashtasks/attach: %v", err)
	}
}

// TestPluginTerminalInTmux uses the plugin's terminal from a real
// terminal: with `run -t` the program sees the window's size and its
// change, ^C interrupts sleep in a shell that survives, a full-screen
// program (top) draws and leaves cleanly, `git add -p` takes an answer,
// killing the plugin detaches, `attach` carries on, and the shell's exit
// code is the plugin's.
func TestPluginTerminalInTmux(t *testing.T) {
	ns := newNamespace(t)
	dir := t.TempDir()
	status := filepath.Join(dir, "status")
	kubeconfig := filepath.Join(clusterDir, "kubeconfig")
	bin := filepath.Join(binDir, "kubectl-bashtask")
	cmd := fmt.Sprintf("env KUBECONFIG=%s %s -n %s run -t --name tt -- %q; echo plugin-exit=$? > %s; sleep 60", kubeconfig, bin, ns, interactiveBash, status)
	tm := startTmux(t, cmd)
	tm.waitFor(prompt)
	tm.send("echo size=$(tput cols)x$(tput lines)", "Enter")
	tm.waitFor("size=160x50")
	tm.run("resize-window", "-t", "t", "-x", "120", "-y", "40")
	tm.send("echo size=$(tput cols)x$(tput lines)", "Enter")
	tm.waitFor("size=120x40")

	// The job says when it runs, and so holds the terminal.
	tm.send("sh -c 'echo job=$((1+1)); exec sleep 300'", "Enter")
	tm.waitFor("job=2")
	tm.send("C-c")
	tm.send("echo status=$?", "Enter")
	tm.waitFor("status=130")

	// A full-screen program: keys typed while it starts or ends may be
	// flushed with the terminal's input (TCSAFLUSH), so each waits for
	// what the screen shows first.
	prompts := strings.Count(tm.screen(), prompt)
	tm.send("top -d 0.5", "Enter")
	tm.waitFor("load average")
	time.Sleep(time.Second)
	tm.send("q")
	// top leaves its last frame on the screen, as on a local terminal;
	// left cleanly, the prompt is back and the terminal's modes are the
	// shell's again (canonical input, echo).
	tm.waitForN(prompt, prompts+1)
	tm.send("echo sane=$(stty -a | tr ' ;' '\\n\\n' | grep -cxE 'icanon|echo')", "Enter")
	tm.waitFor("sane=2")

	tm.send("cd \"$(mktemp -d)\" && git init -q r && cd r && printf 'a\\n' > f && git add f && git -c user.name=t -c user.email=t@t commit -qm i && printf 'b\\n' > f && git add -p", "Enter")
	tm.waitFor("Stage this hunk")
	tm.send("y", "Enter")
	tm.send("echo staged=$(git diff --cached --name-only)", "Enter")
	tm.waitFor("staged=f")

	// Killing the plugin detaches; attach carries on, the screen first.
	tm.run("kill-session", "-t", "t")
	time.Sleep(time.Second)
	var now v1.BashTask
	if err := k8s.Get(t.Context(), ctrlclient.ObjectKey{Namespace: ns, Name: "tt"}, &now); err != nil || now.Status.Reason != nil {
		t.Fatalf("after the plugin was killed the task is %v (%v), want it running", now.Status.Reason, err)
	}
	tm2 := startTmux(t, fmt.Sprintf("env KUBECONFIG=%s %s -n %s attach tt; echo plugin-exit=$? > %s; sleep 60", kubeconfig, bin, ns, status))
	tm2.waitFor("staged=f")
	tm2.send("exit 5", "Enter")
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(status)
		if got := strings.TrimSpace(string(b)); got != "" {
			if got != "plugin-exit=5" {
				t.Fatalf("the plugin's exit: %s\n%s", got, tm2.screen())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attach did not end after exit:\n%s", tm2.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPluginShellTerminalInTmux: `kubectl bashtask shell W` opens a
// terminal in the workspace: vim draws and leaves cleanly, files land in
// the workspace, and the shell's exit code is the plugin's.
func TestPluginShellTerminalInTmux(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "tw", "--network", "None")
	status := filepath.Join(t.TempDir(), "status")
	cmd := fmt.Sprintf("env KUBECONFIG=%s %s -n %s shell tw; echo plugin-exit=$? > %s; sleep 60",
		filepath.Join(clusterDir, "kubeconfig"), filepath.Join(binDir, "kubectl-bashtask"), ns, status)
	tm := startTmux(t, cmd)
	const shellPrompt = ":~$" // bash -il's, in the workspace's root
	tm.waitFor(shellPrompt)
	tm.send("vim -u NONE -N notes.txt", "Enter")
	tm.waitFor("[New")
	time.Sleep(time.Second) // keys typed while vim starts may be flushed
	tm.send("i", "hello from vim", "Escape")
	tm.send(":wq", "Enter")
	if s := tm.waitForN(shellPrompt, 2); strings.Contains(s, "~\n~\n") {
		t.Errorf("vim's screen is still shown after :wq:\n%s", s)
	}
	tm.send("echo file=$(cat ~/notes.txt)", "Enter")
	tm.waitFor("file=hello from vim")
	tm.send("exit 3", "Enter")
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(status)
		if got := strings.TrimSpace(string(b)); got != "" {
			if got != "plugin-exit=3" {
				t.Fatalf("the plugin's exit: %s\n%s", got, tm.screen())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shell did not end after exit:\n%s", tm.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAttachToATaskNotRunning: a task that does not start (suspended)
// is waited for, then refused as not running, naming the wait.
func TestAttachToATaskNotRunning(t *testing.T) {
	ns := newNamespace(t)
	held := createTask(t, ns, "held", interactiveBash, withTTY, func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(true) })
	start := time.Now()
	err := outputClient(t, adminConfig(t)).Attach(t.Context(), ns, held.Name, client.AttachOptions{Stdout: io.Discard})
	if !isCode(err, http.StatusServiceUnavailable) || !strings.Contains(err.Error(), "is not running") {
		t.Fatalf("a suspended task: %v, want 503 saying it is not running", err)
	}
	if d := time.Since(start); d < 25*time.Second {
		t.Errorf("refused after %s, before the 30 s wait for a start", d)
	}
}
