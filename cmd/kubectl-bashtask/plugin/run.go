package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
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

const tailOKHelp = "when bytes of a stream cannot be read from object storage (upload pending or failed, object missing, " +
	"stream past the spill limit), print the tail kept in status after a note instead of failing"

const bucketQueryHelp = "query parameters added to the bucket URL when the full output is read from object storage, " +
	"e.g. 'endpoint=http://127.0.0.1:7070&use_path_style=true' for an S3 server other than AWS (the URL in status carries none)"

func (a *app) runCommand() *cobra.Command {
	var f runFlags
	var bucketQuery string
	var tailOK bool
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [WORDS...]",
		Short: "Run a command as a BashTask, show its output and exit with its exit code",
		Long: `Run creates a BashTask that runs COMMAND with bash -c on a cluster node, follows
it, writes the task's stdout and stderr to the local stdout and stderr as the
task's status shows them, and exits with the task's exit code, like
"kubectl run --rm -i". The words after -- are joined with spaces into the
command string, as ssh does.

The status keeps only the last bytes of each stream. When a stream grows
faster than that between two status updates, run says so on stderr and writes
the rest of that stream when the task ends, from the stored copy in object
storage (read with your own cloud credentials), so the local output is the
whole stream. When the stored copy cannot be read (the upload is still
pending after 30 s or failing, the object is missing, or the stream passed
spec.output.spillLimitBytes), run stops that stream at the first byte it
cannot deliver and exits 125 with a message saying which bytes, why, and how
the task ended; --tail-ok accepts the tail instead, after a note, and passes
the task's exit code through.

Ctrl-C requests cancellation of the task (spec.cancelRequested) and keeps
waiting for it to end; a second Ctrl-C stops waiting.

` + exitStatusHelp,
		Example: `  # Run a command and use its exit status
  kubectl bashtask run -- uname -a

  # Transform local input on a node
  echo '{"a": 1}' | kubectl bashtask run -i -- 'jq .a'

  # Environment from a flag and from every key of a Secret
  kubectl bashtask run --env MODE=fast --env-from-secret api-creds -- ./job.sh

  # A named task, on one node, deleted when done
  kubectl bashtask run --name nightly --node worker-1 --timeout 10m --rm -- make -C /srv/app`,
		// commandFromArgs explains a missing command better than cobra.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd.Context(), f, cmd.Flags().Changed("timeout"), args, bucketQuery, tailOK)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.stdin, "stdin", "i", false, "send the local stdin, read to its end, as the task's stdin (at most 262144 bytes of UTF-8)")
	fl.StringArrayVar(&f.env, "env", nil, "environment variable NAME=VALUE for the command (repeatable)")
	fl.StringArrayVar(&f.envFromSecrets, "env-from-secret", nil,
		"add one variable per key of this Secret, as a reference the controller resolves (repeatable; --env wins, then later Secrets)")
	fl.DurationVar(&f.timeout, "timeout", 0, "the task's time limit (spec.timeoutSeconds, rounded up to seconds; default the API's 120s)")
	fl.StringVar(&f.owner, "owner", "", "spec.owner: an opaque token naming who the task belongs to")
	fl.StringVar(&f.node, "node", "", "run on the agent of this node (spec.nodeName)")
	fl.StringVar(&f.name, "name", "", "the task's name (default: generated, "+generateNamePrefix+"xxxxx)")
	fl.BoolVar(&f.rm, "rm", false, "delete the task when it ended")
	fl.BoolVar(&tailOK, "tail-ok", false, tailOKHelp)
	fl.StringVar(&bucketQuery, "bucket-query", "", bucketQueryHelp)
	return cmd
}

func (a *app) run(ctx context.Context, f runFlags, timeoutSet bool, args []string, bucketQuery string, tailOK bool) error {
	// Mistakes in the arguments are reported before anything is read or
	// sent; the Secrets' keys and stdin only add entries checked again below.
	if _, err := buildTask("", f, timeoutSet, args, nil, nil); err != nil {
		return err
	}
	c, ns, err := a.client()
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
		a.note("cancelling task %s; its output follows when it ends (interrupt again to stop waiting)", key)
		_, err := cancelTask(ctx, c, key)
		return err
	}
	out := newStreamWriter("stdout", a.opts.IOStreams.Out, a.note, true)
	errw := newStreamWriter("stderr", a.opts.IOStreams.ErrOut, a.note, true)
	out.tailOK, errw.tailOK = tailOK, tailOK
	final, err := a.followToEnd(ctx, c, key, a.opts.Interrupts, onInterrupt, out, errw)
	if err != nil {
		return err
	}
	code, msg := taskExit(final)
	if err := a.finishStreams(ctx, final, bucketQuery, out, errw); err != nil {
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
	if f.stdin {
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

// followToEnd writes the streams as they grow until the task has ended and,
// when a stream needs its stored copy, until that copy is uploaded or
// uploadWait passed. It returns the last state seen.
func (a *app) followToEnd(ctx context.Context, c client.WithWatch, key types.NamespacedName, interrupts <-chan os.Signal, onInterrupt interruptFunc, writers ...*streamWriter) (*bashtaskv1alpha1.BashTask, error) {
	var final *bashtaskv1alpha1.BashTask
	err := watchTask(ctx, c, key, interrupts, onInterrupt, func(bt *bashtaskv1alpha1.BashTask) (bool, error) {
		final = bt
		for _, w := range writers {
			if err := w.update(streamOf(bt, w.name)); err != nil {
				return false, err
			}
		}
		return isFinished(bt), nil
	})
	if err != nil {
		return nil, err
	}
	needed := false
	for _, w := range writers {
		if s := streamOf(final, w.name); s != nil && w.complete && w.needsObject(s) {
			needed = true
		}
	}
	if !needed || !uploadPending(final) {
		return final, nil
	}
	a.note("waiting up to %s for the upload of the full output (%s)", uploadWait, missingReason(final))
	wctx, cancel := context.WithTimeout(ctx, uploadWait)
	defer cancel()
	err = watchTask(wctx, c, key, interrupts, onInterrupt, func(bt *bashtaskv1alpha1.BashTask) (bool, error) {
		final = bt
		return !uploadPending(bt), nil
	})
	// Past uploadWait, go on with the tails; only the caller's own end
	// or a real failure stops here.
	uploadWaitOver := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
	if err != nil && !uploadWaitOver {
		return nil, err
	}
	return final, nil
}

// finishStreams writes what is left of each stream of a finished task.
func (a *app) finishStreams(ctx context.Context, bt *bashtaskv1alpha1.BashTask, bucketQuery string, writers ...*streamWriter) error {
	var errs []error
	for _, w := range writers {
		errs = append(errs, w.finish(ctx, streamOf(bt, w.name), objectFetcher(bt, w.name, bucketQuery), missingReason(bt)))
	}
	return errors.Join(errs...)
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
