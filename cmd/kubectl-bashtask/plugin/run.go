package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
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

With -i --stream the task gets spec.stdinStream and the local stdin is sent
while the command runs, through the output API's bashtasks/stdin (create on
bashtasks/stdin in output.bashtask.dev): whatever a read of the local stdin
returns is sent at once, so from a terminal each line reaches the command
when Enter is pressed, and Ctrl-D (EOF) closes the task's stdin. The terminal
stays in its normal (cooked) mode: the line is edited locally, the command
has no terminal. An interactive interpreter needs its interactive flag,
e.g. python3 -i -u.

Ctrl-C requests cancellation of the task (spec.cancelRequested) and keeps
waiting for it to end; a second Ctrl-C stops waiting.

` + exitStatusHelp,
		Example: `  # Run a command and use its exit status
  kubectl bashtask run -- uname -a

  # Transform local input on a node
  echo '{"a": 1}' | kubectl bashtask run -i -- 'jq .a'

  # An interactive Python on a node, typed at from the local terminal
  kubectl bashtask run -i --stream -- python3 -i -u

  # Environment from a flag and from every key of a Secret
  kubectl bashtask run --env MODE=fast --env-from-secret api-creds -- ./job.sh

  # Commands of one session, in a workspace (kubectl bashtask workspace create s1)
  kubectl bashtask run --workspace s1 -- 'git clone https://example.com/repo.git && cd repo'
  kubectl bashtask run --workspace s1 -- make test

  # A named task, on one node, deleted when done
  kubectl bashtask run --name nightly --node worker-1 --timeout 10m --rm -- make -C /srv/app`,
		// commandFromArgs explains a missing command better than cobra.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd.Context(), f, cmd.Flags().Changed("timeout"), args, tailOK)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.stdin, "stdin", "i", false, "send the local stdin, read to its end, as the task's stdin (at most 262144 bytes of UTF-8)")
	fl.BoolVar(&f.stream, "stream", false, "with -i: stream the local stdin to the running task as it is read (spec.stdinStream, any bytes, no size limit); "+
		"EOF on the local stdin (Ctrl-D on a terminal) closes it")
	fl.DurationVar(&f.stdinIdle, "stdin-idle-timeout", 0, "with --stream: spec.stdinStream.idleTimeoutSeconds, how long the task's stdin stays open without a request "+
		"(default the API's 60s; the plugin keeps it open while it runs)")
	fl.StringArrayVar(&f.env, "env", nil, "environment variable NAME=VALUE for the command (repeatable)")
	fl.StringArrayVar(&f.envFromSecrets, "env-from-secret", nil,
		"add one variable per key of this Secret, as a reference the controller resolves (repeatable; --env wins, then later Secrets)")
	fl.DurationVar(&f.timeout, "timeout", 0, "the task's time limit (spec.timeoutSeconds, rounded up to seconds; default the API's 120s)")
	fl.StringVar(&f.owner, "owner", "", "spec.owner: an opaque token naming who the task belongs to")
	fl.StringVar(&f.node, "node", "", "run on the agent of this node (spec.nodeName)")
	fl.StringVarP(&f.workspace, "workspace", "w", "", "run in this BashWorkspace (spec.workspace): its files, UID and network, starting where its last task ended")
	fl.StringVar(&f.workingDir, "workdir", "", "spec.workingDir: the directory to start in (with --workspace: inside it, relative to its root)")
	fl.StringVar(&f.name, "name", "", "the task's name (default: generated, "+generateNamePrefix+"xxxxx)")
	fl.BoolVar(&f.rm, "rm", false, "delete the task when it ended")
	fl.BoolVar(&tailOK, "tail-ok", false, tailOKHelp)
	return cmd
}

func (a *app) run(ctx context.Context, f runFlags, timeoutSet bool, args []string, tailOK bool) error {
	// Mistakes in the arguments are reported before anything is read or
	// sent; the Secrets' keys and stdin only add entries checked again below.
	if _, err := buildTask("", f, timeoutSet, args, nil, nil); err != nil {
		return err
	}
	c, oc, ns, err := a.clients()
	if err != nil {
		return err
	}
	// Until the task exists, an interrupt simply stops.
	setupCtx, stopSetup := a.cancelOnInterrupt(ctx)
	bt, err := a.prepareTask(setupCtx, c, ns, f, timeoutSet, args)
	if err == nil {
		err = c.Create(setupCtx, bt)
		if err != nil {
			err = fmt.Errorf("creating the task: %w", err)
		}
	}
	interrupted := ctx.Err() == nil && setupCtx.Err() != nil
	stopSetup()
	if err != nil {
		if interrupted {
			return &exitError{code: ExitInterrupted, err: errors.New("interrupted before the task was created")}
		}
		return err
	}
	key := types.NamespacedName{Namespace: bt.Namespace, Name: bt.Name}
	if f.rm {
		defer a.deleteTask(ctx, c, bt)
	}

	interrupts := 0
	onInterrupt := func(ctx context.Context) error {
		interrupts++
		if interrupts > 1 {
			return &exitError{code: ExitInterrupted, err: fmt.Errorf("stopped waiting; task %s was asked to cancel and may still be running", key)}
		}
		a.note("cancelling task %s; following it until it ends (interrupt again to stop waiting)", key)
		return cancelCreated(ctx, c, oc, bt)
	}
	if f.stream {
		pctx, stopPump := context.WithCancel(ctx)
		defer stopPump()
		go a.pumpStdin(pctx, oc, bt)
	}
	targets := []streamTarget{{name: "stdout", out: a.opts.IOStreams.Out}, {name: "stderr", out: a.errOut}}
	final, results, err := a.followOutput(ctx, c, oc, key, a.opts.Interrupts, onInterrupt, targets...)
	if err != nil {
		return err
	}
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
			ending = fmt.Sprintf("task %s ended %s", key, ptr.Deref(final.Status.Reason, ""))
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

// prepareTask reads stdin and the Secrets' keys and builds the task.
func (a *app) prepareTask(ctx context.Context, c client.Client, ns string, f runFlags, timeoutSet bool, args []string) (*bashtaskv1alpha1.BashTask, error) {
	var stdin *string
	if f.stdin && !f.stream {
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
