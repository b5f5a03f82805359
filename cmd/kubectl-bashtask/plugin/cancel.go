package plugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// cancelPatch sets spec.cancelRequested, the one-way switch: patching it
// again, or on a finished task, changes nothing, so cancel is idempotent.
var cancelPatch = client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancelRequested":true}}`))

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
			c, ns, err := a.client()
			if err != nil {
				return err
			}
			for _, name := range args {
				bt, err := cancelTask(ctx, c, types.NamespacedName{Namespace: ns, Name: name})
				if err != nil {
					return err
				}
				state := "cancel requested"
				if isFinished(bt) {
					state = fmt.Sprintf("already ended (%s)", ptr.Deref(bt.Status.Reason, ""))
				}
				fmt.Fprintf(a.opts.IOStreams.Out, "bashtask.bashtask.dev/%s %s\n", name, state)
			}
			return nil
		},
	}
}

// cancelTask requests cancellation and returns the task as patched. A task
// that already ended, or whose cancel is already requested, is returned
// unpatched: a spec change would bump its generation past the status's
// observedGeneration, and tools that compare the two (kstatus, Argo CD,
// Flux) would show a finished task as still reconciling.
func cancelTask(ctx context.Context, c client.Client, key types.NamespacedName) (*bashtaskv1alpha1.BashTask, error) {
	bt := &bashtaskv1alpha1.BashTask{}
	if err := c.Get(ctx, key, bt); err != nil {
		return nil, fmt.Errorf("cancelling task %s: %w", key, err)
	}
	if isFinished(bt) || (bt.Spec.CancelRequested != nil && *bt.Spec.CancelRequested) {
		return bt, nil
	}
	if err := c.Patch(ctx, bt, cancelPatch); err != nil {
		return nil, fmt.Errorf("cancelling task %s: %w", key, err)
	}
	return bt, nil
}
