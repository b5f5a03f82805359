package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

const tailOKHelp = "when bytes of a stream cannot be read (past spec.output.spillLimitBytes, or no copy kept), " +
	"print the tail kept in status after a note instead of failing"

func (a *app) runCommand() *cobra.Command {
	var f runFlags
	var tailOK bool
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [WORDS...]",
		Short: "Run a command as a BashTask, show its output and exit with its exit code",
		Long: `Run creates a BashTask that runs COMMAND with bash -c on a cluster node, follows
it, writes the task's stdout and stderr to the local stdout and stderr as the
command writes them, and exits with the task's exit code, like
"kubectl run --rm -i". The words after -- are joined with spaces into the
command string, as ssh does.

Both streams are read through the output API (output.bashtask.dev,
bashtasks/log) with your Kubernetes credentials: each chunk is printed as the
node's agent captures it, and the local output is the whole stream, checked
against status sha256 when the task ends. Reading it takes get on
bashtasks/log in the API group output.bashtask.dev; no bucket credentials.
When bytes of a stream cannot be read (it passed
spec.output.spillLimitBytes, or no copy of it is kept), run stops that stream
at the first byte it cannot deliver and exits 125 with a message naming the
offset, why, and how the task ended; --tail-ok accepts the tail kept in
status instead, after a note, and passes the task's exit code through.

With -t the task gets a terminal (spec.tty) and run attaches the local
terminal to it through bashtasks/attach (get and create on it in
output.bashtask.dev), as "kubectl exec -it" does: the local terminal is in
raw mode, every key reaches the task (^C interrupts its foreground program,
not run), the window size follows the local one, and run exits with the
task's exit code. Killing run detaches; the task runs on and
"kubectl bashtask attach NAME" carries on.

With -i --stream the task gets spec.stdinStream and the local stdin is sent
while the command runs, through the output API's bashtasks/stdin (create on
bashtasks/stdin in output.bashtask.dev): whatever a read of the local stdin
returns is sent at once, so from a terminal each line reaches the command
when Enter is pressed, and Ctrl-D (EOF) closes the task's stdin. The terminal
stays in its normal (cooked) mode: the line is edited locally, the command
has no terminal. An interactive interpreter needs its interactive flag,
e.g. python3 -i -u.

With --workspace W, run reads W first: a W that does not exist, or that
spec.suspend holds, is an error at once; the task takes W's owner unless
--owner is given. While the task is not running yet, run says why on stderr
(each new reason once, the first within 2 s: the workspace is not Ready, no
agent has room, the owner's limit, a missing Secret), and --wait-timeout
bounds the whole wait, from the create to the end: when it passes the task
is cancelled and run exits 124 saying how long it waited and in what state
the task was. --timeout is the task's own time limit, counted from its
start on the node: time spent pending is not in it.

A background process ends with its command: whatever the command left
running when its shell exited is stopped, and run says how many on stderr.
Run a long-lived service (a server the next commands reach on 127.0.0.1 in
the same workspace, say) as a task of its own with --detach: run prints the
task's name on stdout, how to read its output and stop it on stderr, and
exits 0 at once. Its output is read later, from any offset, with
"kubectl bashtask logs NAME".

Tasks that run makes are deleted --ttl (1h) after they end
(spec.ttlSecondsAfterFinished); --ttl 0 leaves them to the controller's
default TTL (an hour unless the cluster configured another).

Ctrl-C requests cancellation of the task (spec.cancelRequested) and keeps
waiting for it to end; a second Ctrl-C stops waiting.

` + exitStatusHelp,
		Example: `  # Run a command and use its exit status
  kubectl bashtask run -- uname -a

  # Transform local input on a node
  echo '{"a": 1}' | kubectl bashtask run -i -- 'jq .a'

  # A shell with a terminal on a node: vim, top, Ctrl-C as on a local one
  kubectl bashtask run -t -- bash -l

  # An interactive Python on a node, typed at from the local terminal
  kubectl bashtask run -i --stream -- python3 -i -u

  # Environment from a flag and from every key of a Secret
  kubectl bashtask run --env MODE=fast --env-from-secret api-creds -- ./job.sh

  # Commands of one session, in a workspace (kubectl bashtask workspace create s1)
  kubectl bashtask run --workspace s1 -- 'git clone https://example.com/repo.git && cd repo'
  kubectl bashtask run --workspace s1 -- make test

  # A server as a task of its own, detached; the next commands reach it
  kubectl bashtask run -w s1 --detach --timeout 10m -- python3 -m http.server 8000
  kubectl bashtask run -w s1 -- curl -s localhost:8000

  # Give up (and cancel) when the command has not ended within a minute,
  # however long it waited for its workspace
  kubectl bashtask run -w s1 --wait-timeout 1m -- make test

  # A named task, on one node, deleted when done
  kubectl bashtask run --name nightly --node worker-1 --timeout 10m --rm -- make -C /srv/app`,
		// commandFromArgs explains a missing command better than cobra.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f.ownerSet = cmd.Flags().Changed("owner")
			return a.run(cmd.Context(), f, cmd.Flags().Changed("timeout"), args, tailOK)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.tty, "tty", "t", false, "give the task a terminal (spec.tty) and attach the local terminal to it, as kubectl exec -it does: "+
		"raw keys, window size, the task's exit code; -i alongside changes nothing")
	fl.BoolVarP(&f.stdin, "stdin", "i", false, "send the local stdin, read to its end, as the task's stdin (at most 262144 bytes of UTF-8)")
	fl.BoolVar(&f.stream, "stream", false, "with -i: stream the local stdin to the running task as it is read (spec.stdinStream, any bytes, no size limit); "+
		"EOF on the local stdin (Ctrl-D on a terminal) closes it")
	fl.DurationVar(&f.stdinIdle, "stdin-idle-timeout", 0, "with --stream: spec.stdinStream.idleTimeoutSeconds, how long the task's stdin stays open without a request "+
		"(default the API's 60s; the plugin keeps it open while it runs)")
	fl.StringArrayVar(&f.env, "env", nil, "environment variable NAME=VALUE for the command (repeatable)")
	fl.StringArrayVar(&f.envFromSecrets, "env-from-secret", nil,
		"add one variable per key of this Secret, as a reference the controller resolves (repeatable; --env wins, then later Secrets)")
	fl.DurationVar(&f.timeout, "timeout", 0, "the task's time limit once it runs on its node (spec.timeoutSeconds, rounded up to seconds; default the API's 120s); "+
		"over the controller's cap, --max-timeout-seconds (600s unless its administrator changed it), the task is refused with InvalidSpec. "+
		"Time pending is not counted: see --wait-timeout")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 0, "bound the whole wait, from the create to the task's end, pending time included: "+
		"when it passes, cancel the task and exit 124 (default: no bound)")
	fl.BoolVar(&f.detach, "detach", false, "create the task, print its name and exit 0 at once; it runs on (read it with logs, stop it with cancel)")
	fl.DurationVar(&f.ttl, "ttl", time.Hour, "delete the task this long after it ended (spec.ttlSecondsAfterFinished, rounded up to seconds); 0 leaves the controller's default TTL, an hour unless configured")
	fl.StringVar(&f.owner, "owner", "", "spec.owner: an opaque token naming who the task belongs to (default with --workspace: the workspace's owner)")
	fl.StringVar(&f.node, "node", "", "run on the agent of this node (spec.nodeName)")
	fl.StringVarP(&f.workspace, "workspace", "w", "", "run in this BashWorkspace (spec.workspace): its files, UID and network, starting where its last task ended")
	fl.StringVar(&f.image, "image", "", "spec.image: run in this OCI image's file system, e.g. docker.io/library/bash:5 (not with --workspace: its tasks run in the workspace's image; "+
		"default: the agent's default image, or the node's root)")
	fl.StringArrayVar(&f.imagePullSecrets, "image-pull-secret", nil, "spec.imagePullSecrets: a Secret of type kubernetes.io/dockerconfigjson whose credentials pull --image (repeatable)")
	fl.StringVar(&f.workingDir, "workdir", "", "spec.workingDir: the directory to start in (with --workspace: inside it, relative to its root)")
	fl.StringVar(&f.name, "name", "", "the task's name (default: generated, "+generateNamePrefix+"xxxxx)")
	fl.BoolVar(&f.rm, "rm", false, "delete the task when it ended")
	fl.BoolVar(&tailOK, "tail-ok", false, tailOKHelp)
	f.egress.add(fl)
	return cmd
}

func (a *app) run(ctx context.Context, f runFlags, timeoutSet bool, args []string, tailOK bool) error {
	// Mistakes in the arguments are reported before anything is read or
	// sent; the Secrets' keys and stdin only add entries checked again below.
	if _, err := buildTask("", f, timeoutSet, args, nil, nil); err != nil {
		return err
	}
	start := time.Now()
	c, oc, ns, err := a.clients()
	if err != nil {
		return err
	}
	bt, err := a.createTask(ctx, c, ns, f, timeoutSet, args)
	if err != nil {
		return err
	}
	if f.detach {
		a.detached(bt)
		return nil
	}
	if f.rm {
		defer a.deleteTask(ctx, c, bt)
	}
	if f.tty {
		return a.attachTerminal(ctx, oc, bt.Namespace, bt.Name)
	}
	if f.stream {
		pctx, stopPump := context.WithCancel(ctx)
		defer stopPump()
		go a.pumpStdin(pctx, oc, bt)
	}
	final, results, err := a.followRun(ctx, c, oc, bt, f.waitTimeout, start)
	if err != nil {
		return err
	}
	a.endNotes(final)
	return a.runExit(final, results, tailOK)
}

// createTask reads what the task needs (the workspace, stdin, the
// Secrets' keys), builds it and creates it. An interrupt until the task
// exists simply stops.
func (a *app) createTask(ctx context.Context, c client.Client, ns string, f runFlags, timeoutSet bool, args []string) (*bashtaskv1alpha1.BashTask, error) {
	setupCtx, stopSetup := a.cancelOnInterrupt(ctx)
	bt, err := a.prepareTask(setupCtx, c, ns, f, timeoutSet, args)
	if err == nil {
		if err = c.Create(setupCtx, bt); err != nil {
			err = fmt.Errorf("creating the task: %w", notServed(err))
		}
	}
	interrupted := ctx.Err() == nil && setupCtx.Err() != nil
	stopSetup()
	if err != nil && interrupted {
		return nil, &exitError{code: ExitInterrupted, err: errors.New("interrupted before the task was created")}
	}
	return bt, err
}

// detached tells the user of --detach which task runs and how to read
// its output and stop it: the name alone on stdout, for scripts.
func (a *app) detached(bt *bashtaskv1alpha1.BashTask) {
	fmt.Fprintln(a.opts.IOStreams.Out, bt.Name)
	ns := ""
	if bt.Namespace != "" {
		ns = " -n " + bt.Namespace
	}
	a.note("task %s runs detached; its output: kubectl bashtask logs%s %s -f (--stderr for stderr); stop it: kubectl bashtask cancel%s %s",
		bt.Name, ns, bt.Name, ns, bt.Name)
}

// followRun follows the task run created until it has ended: its output
// to the local streams, why it waits while it waits, Ctrl-C, and the
// bound of --wait-timeout from start.
func (a *app) followRun(ctx context.Context, c client.WithWatch, oc *btclient.Client, bt *bashtaskv1alpha1.BashTask,
	waitTimeout time.Duration, start time.Time) (*bashtaskv1alpha1.BashTask, []streamResult, error) {
	key := types.NamespacedName{Namespace: bt.Namespace, Name: bt.Name}
	interrupts := 0
	onInterrupt := func(ctx context.Context) error {
		interrupts++
		if interrupts > 1 {
			return &exitError{code: ExitInterrupted, err: fmt.Errorf("stopped waiting; task %s was asked to cancel and may still be running", key)}
		}
		a.note("cancelling task %s; following it until it ends (interrupt again to stop waiting)", key)
		return cancelCreated(ctx, c, oc, bt)
	}
	wctx := ctx
	if waitTimeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, start.Add(waitTimeout))
		defer cancel()
	}
	notes := &waitNotes{a: a, last: bt}
	stopSilent := notes.silentAfter(start)
	defer stopSilent()
	targets := []streamTarget{{name: "stdout", out: a.opts.IOStreams.Out}, {name: "stderr", out: a.errOut}}
	final, results, err := a.followTask(wctx, c, oc, key, followHooks{created: bt, observe: notes.observe}, a.opts.Interrupts, onInterrupt, targets...)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		return nil, nil, a.waitTimedOut(ctx, c, oc, bt, notes.lastSeen(), waitTimeout, start)
	}
	return final, results, err
}

// waitTimedOut cancels the task once --wait-timeout passed and returns
// the exit of run: 124, how long it waited and in what state the task was.
func (a *app) waitTimedOut(ctx context.Context, c client.Client, oc *btclient.Client, created, last *bashtaskv1alpha1.BashTask,
	waitTimeout time.Duration, start time.Time) error {
	state := string(phaseOrPending(last))
	if _, line, ok := btclient.PendingNote(last); ok {
		state += " (" + strings.TrimPrefix(line, "task "+last.Name+" is not running yet: ") + ")"
	}
	msg := fmt.Sprintf("task %s/%s did not end within --wait-timeout %s: waited %s, and it is still %s", created.Namespace, created.Name,
		waitTimeout, time.Since(start).Round(time.Millisecond), state)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := cancelCreated(cctx, c, oc, created); err != nil {
		return &exitError{code: ExitWaitTimeout, err: fmt.Errorf("%s; cancelling it failed: %w", msg, err)}
	}
	return &exitError{code: ExitWaitTimeout, err: errors.New(msg + "; it was asked to cancel (spec.cancelRequested)")}
}

// runExit checks the streams of the task that has ended and maps its end
// to run's exit.
func (a *app) runExit(final *bashtaskv1alpha1.BashTask, results []streamResult, tailOK bool) error {
	targets := []streamTarget{{name: "stdout", out: a.opts.IOStreams.Out}, {name: "stderr", out: a.errOut}}
	code, msg := taskExit(final)
	var errs []error
	for i, t := range targets {
		errs = append(errs, a.finishStream(t, &results[i], final, tailOK))
	}
	if err := errors.Join(errs...); err != nil {
		// The output is short: the task's own exit status would say all
		// went well when it succeeded. How it ended is still worth saying.
		ending := msg
		if ending == "" {
			ending = fmt.Sprintf("task %s/%s ended %s", final.Namespace, final.Name, ptr.Deref(final.Status.Reason, ""))
			if final.Status.ExitCode != nil {
				ending += fmt.Sprintf(" (exit code %d)", *final.Status.ExitCode)
			}
		}
		return fmt.Errorf("%w; %s", err, ending)
	}
	if code == ExitOK {
		return nil
	}
	if msg == "" {
		return &exitError{code: code}
	}
	return &exitError{code: code, err: errors.New(msg)}
}

// endNotes says, after the task's output, what else its end holds for
// the user: processes the command left behind, which were stopped.
func (a *app) endNotes(final *bashtaskv1alpha1.BashTask) {
	if n := ptr.Deref(final.Status.LeftoverProcesses, 0); n > 0 {
		a.note("task %s/%s: the command left %d %s running when its shell exited, and %s stopped: a background process ends with its command. "+
			"Run a long-lived service as a task of its own with --detach (docs/workspaces.md)",
			final.Namespace, final.Name, n, plural(int(n), "process", "processes"), plural(int(n), "it was", "they were"))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// waitNotes tells the user why a task is not running yet, from the
// Scheduled=False condition the controller writes while it waits: each
// new reason once. When the controller says nothing for
// btclient.SilentWaitNote, it says that. A task that is the first on a
// workspace copy restored from a snapshot says so once, as soon as its
// dispatch shows it (restoreNote).
type waitNotes struct {
	a        *app
	mu       sync.Mutex
	last     *bashtaskv1alpha1.BashTask
	noted    map[string]bool
	restored bool
	// pullNoted is when the image pull's progress was last noted.
	pullNoted time.Time
}

// pullNoteEvery is the shortest time between two notes of an image
// pull's progress.
const pullNoteEvery = 3 * time.Second

func (n *waitNotes) observe(bt *bashtaskv1alpha1.BashTask) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last = bt
	if line := pullNote(bt); line != "" && n.a.opts.Now().Sub(n.pullNoted) >= pullNoteEvery {
		n.pullNoted = n.a.opts.Now()
		n.a.note("%s", line)
	}
	if line := restoreNote(bt); line != "" && !n.restored {
		n.restored = true
		n.a.note("%s", line)
	}
	reason, line, ok := btclient.PendingNote(bt)
	if !ok || n.noted[reason] {
		return
	}
	if n.noted == nil {
		n.noted = map[string]bool{}
	}
	n.noted[reason] = true
	n.a.note("%s", line)
}

// pullNote is the line that tells of the pull of a task's image while
// its node pulls it (the ImagePulled condition False with the reason
// Pulling), "" otherwise.
func pullNote(bt *bashtaskv1alpha1.BashTask) string {
	c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionImagePulled)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != bashtaskv1alpha1.ReasonImagePulling || bt.Status.Reason != nil {
		return ""
	}
	return fmt.Sprintf("task %s: node %s is %s", bt.Name, ptr.Deref(bt.Status.NodeName, "?"), c.Message)
}

func (n *waitNotes) lastSeen() *bashtaskv1alpha1.BashTask {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

// silentAfter notes, btclient.SilentWaitNote after start, a task that
// the controller has neither dispatched nor said anything about; the
// returned function stops it.
func (n *waitNotes) silentAfter(start time.Time) func() {
	t := time.AfterFunc(max(0, btclient.SilentWaitNote-time.Since(start)), func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if len(n.noted) == 0 && n.last.Status.NodeName == nil && n.last.Status.Reason == nil {
			n.a.note("%s", btclient.SilentNote(n.last, time.Since(start)))
		}
	})
	return func() { t.Stop() }
}

// notServed adds to a 404 without a name, kube-apiserver's answer for a
// resource it does not serve, that the CRD is missing: the plugin maps
// the kinds itself (no discovery), so this is where that shows.
func notServed(err error) error {
	var se apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &se) || (se.Status().Details != nil && se.Status().Details.Name != "") {
		return err
	}
	return fmt.Errorf("%w: the cluster does not serve bashtask.dev/v1alpha1; install the BashTask CRD (config/crd) first", err)
}

// prepareTask reads the workspace, stdin and the Secrets' keys and builds
// the task.
func (a *app) prepareTask(ctx context.Context, c client.Client, ns string, f runFlags, timeoutSet bool, args []string) (*bashtaskv1alpha1.BashTask, error) {
	if f.workspace != "" {
		ws, err := checkWorkspace(ctx, c, ns, f.workspace)
		if err != nil {
			return nil, err
		}
		if !f.ownerSet {
			f.owner = ptr.Deref(ws.Spec.Owner, "")
		}
	}
	var stdin *string
	if f.stdin && !f.stream && !f.tty {
		s, err := a.readStdinInterruptible(ctx)
		if err != nil {
			return nil, err
		}
		stdin = &s
	}
	keys := map[string][]string{}
	for _, name := range f.envFromSecrets {
		// Read with the user's credentials: the user must be able to
		// read the Secret to hand its values to a command.
		var s corev1.Secret
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
			return nil, fmt.Errorf("--env-from-secret %s: reading the Secret: %w", name, err)
		}
		keys[name] = slices.Sorted(maps.Keys(s.Data))
	}
	return buildTask(ns, f, timeoutSet, args, stdin, keys)
}

// checkWorkspace reads the workspace of --workspace: one that does not
// exist, or that spec.suspend holds, is an error at once, where the task
// would only wait or be refused.
func checkWorkspace(ctx context.Context, c client.Client, ns, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	var ws bashtaskv1alpha1.BashWorkspace
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ws)
	if apierrors.IsNotFound(err) {
		var se apierrors.APIStatus
		if errors.As(err, &se) && se.Status().Details != nil && se.Status().Details.Name != "" {
			return nil, fmt.Errorf("--workspace %s: BashWorkspace %q not found in namespace %s; create it with: kubectl bashtask workspace create -n %s %s",
				name, name, ns, ns, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--workspace %s: reading the workspace: %w", name, notServed(err))
	}
	if ptr.Deref(ws.Spec.Suspend, false) {
		return nil, fmt.Errorf("--workspace %s: BashWorkspace %q is held (spec.suspend is true, phase %s): it takes no task until it is resumed: kubectl bashtask workspace resume -n %s %s",
			name, name, orNone(string(ptr.Deref(ws.Status.Phase, ""))), ns, name)
	}
	return &ws, nil
}

// readStdinInterruptible reads stdin for -i; an interrupt ends the wait,
// since a terminal's Ctrl-C no longer kills the process once the plugin
// handles it.
func (a *app) readStdinInterruptible(ctx context.Context) (string, error) {
	type result struct {
		s   string
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := readStdin(a.opts.IOStreams.In)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		return "", fmt.Errorf("reading stdin for -i: %w", ctx.Err())
	}
}

func streamOf(bt *bashtaskv1alpha1.BashTask, name string) *bashtaskv1alpha1.StreamStatus {
	if name == "stderr" {
		return bt.Status.Stderr
	}
	return bt.Status.Stdout
}

// deleteTask deletes the task run created, for --rm. It runs even after the
// user gave up waiting or ctx ended, so it has a context of its own; the UID
// precondition keeps it from deleting a newer task of the same name.
func (a *app) deleteTask(ctx context.Context, c client.Client, bt *bashtaskv1alpha1.BashTask) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := c.Delete(dctx, bt, client.Preconditions{UID: &bt.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		a.note("--rm: deleting task %s/%s: %v", bt.Namespace, bt.Name, err)
	}
}
