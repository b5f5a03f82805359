package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

func (a *app) cancelCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel NAME...",
		Short: "Request cancellation of tasks (spec.cancelRequested=true)",
		Long: `Cancel sets spec.cancelRequested on each named task. The agent stops a running
command with SIGTERM, the task's grace period, then SIGKILL, and the task ends
Cancelled. Cancelling a finished or already cancelled task changes nothing.
Cancel does not wait; use "kubectl bashtask wait NAME" for that.`,
		Example: `  kubectl bashtask cancel run-x7k2p && kubectl bashtask wait run-x7k2p`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := a.cancelOnInterrupt(cmd.Context())
			defer stop()
			c, oc, ns, err := a.clients()
			if err != nil {
				return err
			}
			// Like kubectl delete: every name is tried, and the errors
			// of the names that failed are reported together.
			var errs []error
			for _, name := range args {
				state, err := cancelByName(ctx, c, oc, types.NamespacedName{Namespace: ns, Name: name})
				if err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(a.opts.IOStreams.Out, "bashtask.bashtask.dev/%s %s\n", name, state)
			}
			return errors.Join(errs...)
		},
	}
}

// cancelByName reads the task key and requests its cancellation
// (cancelTask), and says what happened for the command's output.
func cancelByName(ctx context.Context, c client.Client, oc *btclient.Client, key types.NamespacedName) (string, error) {
	bt := &bashtaskv1alpha1.BashTask{}
	if err := c.Get(ctx, key, bt); err != nil {
		return "", fmt.Errorf("cancelling task %s: %w", key, err)
	}
	if err := cancelTask(ctx, oc, bt); err != nil {
		return "", err
	}
	if isFinished(bt) {
		return fmt.Sprintf("already ended (%s)", ptr.Deref(bt.Status.Reason, "")), nil
	}
	return "cancel requested", nil
}

// cancelTask requests cancellation of bt, the task as the caller read it
// last, through client.Cancel with bt's UID as a precondition: a task
// deleted and made again under the same name since that read is a
// different task, and the API server refuses the patch instead of
// cancelling it (client.ErrTaskReplaced). A task that already ended, or
// whose cancel is already requested, is not patched: a spec change would
// bump its generation past the status's observedGeneration, and tools that
// compare the two (kstatus, Argo CD, Flux) would show a finished task as
// still reconciling.
func cancelTask(ctx context.Context, oc *btclient.Client, bt *bashtaskv1alpha1.BashTask) error {
	if isFinished(bt) || ptr.Deref(bt.Spec.CancelRequested, false) {
		return nil
	}
	err := oc.Cancel(ctx, bt.Namespace, bt.Name, bt.UID)
	if errors.Is(err, btclient.ErrTaskReplaced) {
		return fmt.Errorf("task %s/%s was deleted and made again under its name since it was read (it was uid %s); "+
			"the new task is not cancelled (cancel it by name to do so)", bt.Namespace, bt.Name, bt.UID)
	}
	return err
}

// cancelCreated requests cancellation of the task created as created,
// from the task as the API server has it now: a task that ended meanwhile
// is left as it is, and one made again under its name (another UID) is not
// cancelled.
func cancelCreated(ctx context.Context, c client.Client, oc *btclient.Client, created *bashtaskv1alpha1.BashTask) error {
	bt := &bashtaskv1alpha1.BashTask{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(created), bt); err != nil {
		return fmt.Errorf("cancelling task %s/%s: %w", created.Namespace, created.Name, err)
	}
	if bt.UID != created.UID {
		// Read after the replacement: cancelTask's precondition would
		// refuse it; say so without a round trip.
		bt = created
	}
	return cancelTask(ctx, oc, bt)
}
