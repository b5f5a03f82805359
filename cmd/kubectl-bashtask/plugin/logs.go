package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

type logsFlags struct {
	stderr, full, follow, tailOK, tailOnly bool
	stream                                 string
	// uid is --uid: the task with this metadata.uid, live or deleted.
	uid string
}

func (a *app) logsCommand() *cobra.Command {
	var f logsFlags
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print a task's stdout or stderr, the whole stream, through the output API",
		Long: `Logs prints a task's stdout (or stderr with --stderr) from its first byte, as
"kubectl logs" prints a container's: for a task that has ended, the whole
stream, checked against status sha256; for a running one, what it wrote so
far. It reads through the output API (output.bashtask.dev, bashtasks/log)
with your Kubernetes credentials, which need get on bashtasks/log in that
group; no bucket credentials.

-f follows a running task, printing each chunk as the node's agent captures
it, until the task ends.

--stream all prints both streams in the order the node's agent read them:
stdout's bytes to your stdout, stderr's to your stderr, so an error shows up
next to the output it belongs to (docs/output.md, "stdout and stderr in one
stream"). Each stream is checked against its status sha256 once the task has
ended; --tail-ok and --tail-only do not apply.

--full insists on the whole stream: it refuses a task that has not ended
(add -f to follow it until then). Without -f or --full the same stream is
printed; --full is there for scripts that say what they mean.

When some bytes cannot be read (the stream passed
spec.output.spillLimitBytes, or no copy of it is kept: spec.output.upload
Never after the agent forgot the task, or the agent is unreachable before
its upload), logs writes the stream up to the first such byte and exits 1
with a message naming the offset and why, so "logs > out" never leaves a
short file behind an exit status of 0. --tail-ok accepts the last bytes kept
in status instead: the tail follows a note and the exit status is 0.

A task deleted after it ended (its TTL, or kubectl delete) is read from the
record the controller kept in the output bucket: by name, the task of that
name deleted last; --uid picks one by its metadata.uid (docs/output.md,
"After the task is deleted"). Its bytes are checked by the output API
against what the record says, not here.

--tail-only prints only the tail kept in the task's status
(status.stdout.tail), with a note when the stream is longer; it needs no
access to the output API, only get on bashtasks.`,
		Example: `  kubectl bashtask logs run-x7k2p
  kubectl bashtask logs run-x7k2p --stderr -f
  kubectl bashtask logs run-x7k2p --stream all -f
  kubectl bashtask logs big-report --full > report.txt
  kubectl bashtask logs run-x7k2p --tail-only
  kubectl bashtask logs nightly --uid 6f1c2a0e-3b1d-4c55-9a43-2f7f7f0b9e21`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.logs(cmd.Context(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.stderr, "stderr", false, "print stderr instead of stdout (--stream stderr)")
	fl.StringVar(&f.stream, "stream", "", "the stream to print: stdout (the default), stderr, or all (both, in the order they were read, each to its local stream)")
	fl.BoolVar(&f.full, "full", false, "print the whole stream of a task that has ended; refuse one that has not (without -f)")
	fl.BoolVarP(&f.follow, "follow", "f", false, "follow the stream until the task ends")
	fl.BoolVar(&f.tailOK, "tail-ok", false, tailOKHelp)
	fl.BoolVar(&f.tailOnly, "tail-only", false, "print only the tail kept in the task's status, without the output API")
	fl.StringVar(&f.uid, "uid", "", "read the task with this metadata.uid, also one deleted since (from its record in the output bucket)")
	return cmd
}

func (a *app) logs(ctx context.Context, name string, f logsFlags) error {
	if f.tailOnly && (f.full || f.follow || f.tailOK || f.uid != "") {
		return errors.New("--tail-only prints the tail kept in status; it cannot be combined with --full, -f, --tail-ok or --uid")
	}
	stream, err := logsStream(f)
	if err != nil {
		return err
	}
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	if stream == outputv1alpha1.StreamAll {
		return a.logsAll(ctx, name, f)
	}
	target := streamTarget{name: stream, out: a.opts.IOStreams.Out}
	if f.tailOnly {
		c, ns, err := a.client()
		if err != nil {
			return err
		}
		return a.printTail(ctx, c, types.NamespacedName{Namespace: ns, Name: name}, stream)
	}
	c, oc, ns, err := a.clients()
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	if gone, err := deletedTask(ctx, c, key, f.uid); err != nil || gone {
		if err != nil {
			return err
		}
		return a.logsDeleted(ctx, oc, key, types.UID(f.uid), target)
	}
	if f.follow {
		final, results, err := a.followOutput(ctx, c, oc, key, nil, nil, target)
		if err != nil {
			return err
		}
		return a.finishStream(target, &results[0], final, f.tailOK)
	}
	bt, err := a.logsTask(ctx, c, key, f)
	if err != nil {
		return err
	}
	res := copyStream(ctx, oc, key, target, false)
	var se *btclient.StreamError
	if res.err != nil && !errors.As(res.err, &se) {
		return outputError(stream, key, res.err)
	}
	if isFinished(bt) {
		return a.finishStream(target, &res, bt, f.tailOK)
	}
	if se != nil {
		// Running: what its status says of the stream is not final.
		return &incompleteError{stream: stream, offset: res.written, end: -1, total: -1, why: se.Message}
	}
	return nil
}

// logsStream is the stream the flags name: --stream, or --stderr's.
func logsStream(f logsFlags) (string, error) {
	switch f.stream {
	case "":
		if f.stderr {
			return outputv1alpha1.StreamStderr, nil
		}
		return outputv1alpha1.StreamStdout, nil
	case outputv1alpha1.StreamStdout, outputv1alpha1.StreamStderr, outputv1alpha1.StreamAll:
	default:
		return "", fmt.Errorf("--stream %q: must be stdout, stderr or all", f.stream)
	}
	if f.stderr && f.stream != outputv1alpha1.StreamStderr {
		return "", fmt.Errorf("--stderr and --stream %s name different streams", f.stream)
	}
	if f.stream == outputv1alpha1.StreamAll && (f.tailOK || f.tailOnly) {
		return "", errors.New("--stream all prints both streams through the output API; --tail-ok and --tail-only apply to one stream")
	}
	return f.stream, nil
}

// logsTask reads the task, refusing one that has not ended for --full
// without -f.
func (a *app) logsTask(ctx context.Context, c client.Client, key types.NamespacedName, f logsFlags) (*bashtaskv1alpha1.BashTask, error) {
	bt := &bashtaskv1alpha1.BashTask{}
	if err := c.Get(ctx, key, bt); err != nil {
		return nil, fmt.Errorf("reading task %s: %w", key, err)
	}
	if f.full && !f.follow && !isFinished(bt) {
		return nil, fmt.Errorf("task %s is %s: --full prints the whole stream once the task has ended; add -f to follow it until then", key, phaseOrPending(bt))
	}
	return bt, nil
}

// logsAll prints both streams in the order they were read (--stream all),
// then, for a task that has ended, checks each against its status.
func (a *app) logsAll(ctx context.Context, name string, f logsFlags) error {
	c, oc, ns, err := a.clients()
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	if gone, err := deletedTask(ctx, c, key, f.uid); err != nil || gone {
		if err != nil {
			return err
		}
		return a.logsDeletedAll(ctx, oc, key, types.UID(f.uid))
	}
	bt, err := a.logsTask(ctx, c, key, f)
	if err != nil {
		return err
	}
	res := copyCombined(ctx, oc, key, a.opts.IOStreams.Out, a.opts.IOStreams.ErrOut, f.follow)
	var se *btclient.StreamError
	if res.err != nil && !errors.As(res.err, &se) {
		return outputError("stdout and stderr", key, res.err)
	}
	if se != nil {
		return &incompleteError{stream: "stdout and stderr", offset: se.Offset, end: -1, total: -1, why: se.Message}
	}
	if f.follow {
		if err := c.Get(ctx, key, bt); err != nil {
			return fmt.Errorf("reading task %s: %w", key, err)
		}
	}
	if !isFinished(bt) {
		return nil
	}
	return errors.Join(verify("stdout", &res.streams[0], bt.Status.Stdout), verify("stderr", &res.streams[1], bt.Status.Stderr))
}

// printTail prints the tail of a stream kept in the task's status, for
// --tail-only.
func (a *app) printTail(ctx context.Context, c client.Client, key types.NamespacedName, stream string) error {
	bt := &bashtaskv1alpha1.BashTask{}
	if err := c.Get(ctx, key, bt); err != nil {
		return fmt.Errorf("reading task %s: %w", key, err)
	}
	s := streamOf(bt, stream)
	if s == nil {
		return nil
	}
	tail := ptr.Deref(s.Tail, "")
	if _, err := fmt.Fprint(a.opts.IOStreams.Out, tail); err != nil {
		return fmt.Errorf("writing %s: %w", stream, err)
	}
	if ptr.Deref(s.Truncated, false) {
		a.note("%s: showing the last %d of %d bytes kept in status; without --tail-only logs prints the whole stream", stream, len(tail), ptr.Deref(s.TotalBytes, 0))
	}
	return nil
}
