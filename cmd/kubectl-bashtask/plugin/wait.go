package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func (a *app) waitCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait NAME",
		Short: "Wait for a task to end and exit with its exit code",
		Long: `Wait follows a task until it has ended, prints its name and reason, and exits
like run: 0 when it succeeded, its exit code when it exited non-zero, 1 with a
message for any other ending. With --timeout it gives up after that long with
exit status 124; the task keeps running. An interrupt stops waiting, not the task.

` + exitStatusHelp,
		Example: `  kubectl bashtask wait run-x7k2p --timeout 5m; echo "exit $?"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.wait(cmd.Context(), args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long with exit status 124 (default: no limit)")
	return cmd
}

func (a *app) wait(ctx context.Context, name string, timeout time.Duration) error {
	if timeout < 0 {
		return fmt.Errorf("--timeout %s: must not be negative", timeout)
	}
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, ns, err := a.client()
	if err != nil {
		return err
	}
	wctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	var last *bashtaskv1alpha1.BashTask
	err = watchTask(wctx, c, key, nil, nil, func(bt *bashtaskv1alpha1.BashTask) (bool, error) {
		last = bt
		return isFinished(bt), nil
	})
	switch {
	case err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && last != nil:
		return &exitError{code: ExitWaitTimeout, err: fmt.Errorf("task %s still %s after --timeout %s", key, phaseOrPending(last), timeout)}
	case err != nil && ctx.Err() != nil:
		return &exitError{code: ExitInterrupted, err: fmt.Errorf("interrupted while waiting for task %s", key)}
	case err != nil:
		return err
	}
	line := fmt.Sprintf("bashtask.bashtask.dev/%s %s", name, ptr.Deref(last.Status.Reason, ""))
	if last.Status.ExitCode != nil {
		line += fmt.Sprintf(" (exit code %d)", *last.Status.ExitCode)
	}
	fmt.Fprintln(a.opts.IOStreams.Out, line)
	code, msg := taskExit(last)
	switch {
	case code == ExitOK:
		return nil
	case msg == "":
		return &exitError{code: code}
	}
	return &exitError{code: code, err: errors.New(msg)}
}

func phaseOrPending(bt *bashtaskv1alpha1.BashTask) bashtaskv1alpha1.Phase {
	return ptr.Deref(bt.Status.Phase, bashtaskv1alpha1.PhasePending)
}
