package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// The snapshot commands of a workspace (docs/workspaces.md, "Snapshots"):
// each writes one spec field with a merge patch and waits for the
// controller's answer in status.

func (a *app) workspaceSnapshotCommand() *cobra.Command {
	var waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "snapshot NAME",
		Short: "Snapshot a workspace to the agents' bucket now (spec.snapshot.request), without stopping its tasks",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			token := a.opts.Now().UTC().Format("20060102T150405.000000000Z")
			return a.workspacePatch(cmd.Context(), args[0], waitFor,
				map[string]any{"snapshot": map[string]any{"request": token}},
				func(ws *bashtaskv1alpha1.BashWorkspace) (bool, string) {
					s := ws.Status.Snapshot
					if s == nil || ptr.Deref(s.Request, "") != token {
						return false, ""
					}
					return true, fmt.Sprintf("bashworkspace/%s snapshot of %d bytes (%d changed while read) at %s", ws.Name,
						ptr.Deref(s.Bytes, 0), ptr.Deref(s.ChangedFiles, 0), ptr.Deref(s.URL, ""))
				})
		},
	}
	cmd.Flags().DurationVar(&waitFor, "wait", 10*time.Minute, "how long to wait for the snapshot; 0 returns at once")
	return cmd
}

func (a *app) workspaceSuspendCommand() *cobra.Command {
	var waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "suspend NAME",
		Short: "Suspend a workspace (spec.suspend): snapshot it once its tasks end, then release its node's copy and UID",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workspacePatch(cmd.Context(), args[0], waitFor, map[string]any{"suspend": true},
				func(ws *bashtaskv1alpha1.BashWorkspace) (bool, string) {
					if ptr.Deref(ws.Status.Phase, "") != bashtaskv1alpha1.WorkspaceSuspended || ws.Status.NodeName != nil {
						return false, ""
					}
					return true, fmt.Sprintf("bashworkspace/%s suspended to its snapshot of %s", ws.Name, snapshotAge(ws, a.opts.Now()))
				})
		},
	}
	cmd.Flags().DurationVar(&waitFor, "wait", 10*time.Minute, "how long to wait until it is Suspended; 0 returns at once")
	return cmd
}

func (a *app) workspaceResumeCommand() *cobra.Command {
	var waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "resume NAME",
		Short: "Resume a suspended workspace: restore it from its snapshot on a node that fits its placement",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workspacePatch(cmd.Context(), args[0], waitFor, map[string]any{"suspend": false},
				func(ws *bashtaskv1alpha1.BashWorkspace) (bool, string) {
					if ptr.Deref(ws.Status.Phase, "") != bashtaskv1alpha1.WorkspaceReady || ptr.Deref(ws.Spec.Suspend, false) {
						return false, ""
					}
					return true, fmt.Sprintf("bashworkspace/%s ready on %s (epoch %d, uid %d)", ws.Name,
						ptr.Deref(ws.Status.NodeName, "?"), ptr.Deref(ws.Status.Epoch, 0), ptr.Deref(ws.Status.RunAsUser, -1))
				})
		},
	}
	cmd.Flags().DurationVar(&waitFor, "wait", 10*time.Minute, "how long to wait until it is Ready; 0 returns at once")
	return cmd
}

// workspacePatch merges spec into workspace name's spec and, unless
// waitFor is 0, waits until done says the controller answered, then
// prints done's line; the wait is a watch. A Failed or NodeLost workspace
// ends it with its message.
func (a *app) workspacePatch(ctx context.Context, name string, waitFor time.Duration, spec map[string]any,
	done func(*bashtaskv1alpha1.BashWorkspace) (bool, string)) error {
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, bc, ns, err := a.clients()
	if err != nil {
		return err
	}
	body, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return err
	}
	ws := &bashtaskv1alpha1.BashWorkspace{}
	ws.Namespace, ws.Name = ns, name
	if err := c.Patch(ctx, ws, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("updating workspace %s/%s: %w", ns, name, err)
	}
	if waitFor <= 0 {
		fmt.Fprintf(a.opts.IOStreams.Out, "bashworkspace/%s patched\n", name)
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	var line string
	last := ws
	_, err = bc.WaitWorkspace(wctx, ns, name, func(got *bashtaskv1alpha1.BashWorkspace) bool {
		last = got
		ok, l := done(got)
		line = l
		return ok
	})
	var fe *btclient.WorkspaceFailedError
	if errors.As(err, &fe) {
		return fe
	}
	if err != nil {
		return fmt.Errorf("workspace %s/%s after %s: phase %s: %s", ns, name, waitFor,
			orNone(string(ptr.Deref(last.Status.Phase, ""))), ptr.Deref(last.Status.Message, ""))
	}
	fmt.Fprintln(a.opts.IOStreams.Out, line)
	return nil
}

// snapshotAge is the workspace's last snapshot's age, "<none>" without one.
func snapshotAge(ws *bashtaskv1alpha1.BashWorkspace, now time.Time) string {
	s := ws.Status.Snapshot
	if s == nil || s.Time == nil {
		return "<none>"
	}
	return duration.HumanDuration(now.Sub(s.Time.Time)) + " ago"
}
