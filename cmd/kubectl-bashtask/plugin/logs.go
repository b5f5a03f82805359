package plugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

type logsFlags struct {
	stderr, full, follow, tailOK bool
	bucketQuery                  string
}

func (a *app) logsCommand() *cobra.Command {
	var f logsFlags
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print a task's stdout or stderr: the tail in status, or the whole stream",
		Long: `Logs prints the tail of a task's stdout (or stderr with --stderr) kept in its
status, with a note on stderr when the stream is longer than the tail.

--full prints the whole stream of a finished task: from the copy the agent
stored in object storage when the tail is not the whole stream, read through
gocloud.dev/blob with your own credentials (file://, s3://, gs://, azblob://),
and checked against status sha256. When some bytes cannot be had (the upload
is pending or failing, the object is missing, or the stream passed the spill
limit), --full writes the stream up to the first such byte and exits 1 with a
message saying which bytes and why, so "logs --full > out" never leaves a
short file behind an exit status of 0. --tail-ok accepts the last bytes
instead: the tail follows a note and the exit status is 0.

-f follows a running task, printing the stream as its status grows, until the
task ends. With --full as well, the output is the whole stream from its first
byte; without it, bytes that went past the tail between two updates are
skipped with a note.`,
		Example: `  kubectl bashtask logs run-x7k2p
  kubectl bashtask logs run-x7k2p --stderr -f
  kubectl bashtask logs big-report --full > report.txt
  kubectl bashtask logs t1 --full --bucket-query 'endpoint=http://127.0.0.1:7070&use_path_style=true'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.logs(cmd.Context(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.stderr, "stderr", false, "print stderr instead of stdout")
	fl.BoolVar(&f.full, "full", false, "print the whole stream, from object storage when the tail is not all of it")
	fl.BoolVarP(&f.follow, "follow", "f", false, "follow the stream until the task ends")
	fl.BoolVar(&f.tailOK, "tail-ok", false, tailOKHelp)
	fl.StringVar(&f.bucketQuery, "bucket-query", "", bucketQueryHelp)
	return cmd
}

func (a *app) logs(ctx context.Context, name string, f logsFlags) error {
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, ns, err := a.client()
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	stream := "stdout"
	if f.stderr {
		stream = "stderr"
	}
	w := newStreamWriter(stream, a.opts.IOStreams.Out, a.note, f.full)
	w.tailOK = f.tailOK
	var bt *bashtaskv1alpha1.BashTask
	if f.follow {
		if bt, err = a.followToEnd(ctx, c, key, nil, nil, w); err != nil {
			return err
		}
	} else {
		bt = &bashtaskv1alpha1.BashTask{}
		if err := c.Get(ctx, key, bt); err != nil {
			return fmt.Errorf("reading task %s: %w", key, err)
		}
		if f.full && !isFinished(bt) {
			return fmt.Errorf("task %s is %s: --full reads the stored stream once the task has ended; add -f to follow it until then", key, phaseOrPending(bt))
		}
		if !f.full {
			s := streamOf(bt, stream)
			if s == nil {
				return nil
			}
			tail := ptr.Deref(s.Tail, "")
			if _, err := fmt.Fprint(a.opts.IOStreams.Out, tail); err != nil {
				return fmt.Errorf("writing %s: %w", stream, err)
			}
			if ptr.Deref(s.Truncated, false) {
				a.note("%s: showing the last %d of %d bytes; --full prints the whole stream", stream, len(tail), ptr.Deref(s.TotalBytes, 0))
			}
			return nil
		}
	}
	if !isFinished(bt) {
		return nil
	}
	return w.finish(ctx, streamOf(bt, stream), objectFetcher(bt, stream, f.bucketQuery), missingReason(bt))
}
