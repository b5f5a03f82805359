package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// workspaceForkFlags are the flags of "workspace fork".
type workspaceForkFlags struct {
	count      int
	namePrefix string
	node       string
	wait       time.Duration
}

// forkOptions checks the flags against the API's limits, naming the flag,
// and returns the client's options for source in ns.
func forkOptions(ns, source string, f workspaceForkFlags) (btclient.ForkOptions, error) {
	o := btclient.ForkOptions{Namespace: ns, Source: source, Count: f.count, NamePrefix: f.namePrefix, NodeName: f.node, NoWait: f.wait <= 0}
	if f.count < 1 || f.count > btclient.MaxForkCount {
		return o, fmt.Errorf("--count %d: 1 to %d copies", f.count, btclient.MaxForkCount)
	}
	// generateName leaves room for the 5 random characters of a name of
	// at most 253.
	if n := len(f.namePrefix); n > maxNameChars-5 {
		return o, fmt.Errorf("--name-prefix: metadata.generateName is %d characters, over the limit of %d", n, maxNameChars-5)
	}
	return o, charLimit("--node", "spec.nodeName", f.node)
}

func (a *app) workspaceForkCommand() *cobra.Command {
	var f workspaceForkFlags
	cmd := &cobra.Command{
		Use:   "fork NAME",
		Short: "Copy a workspace into new ones (spec.source): its files and carried state as of one instant, while it keeps running",
		Long: `Each copy is a BashWorkspace whose spec.source names NAME: it gets NAME's files
and carried working directory and environment as of one instant, its own UID,
network and quota, and NAME's owner. On NAME's node the copy is local (NAME's
writes are frozen for the copy, status.forkedFrom says how long); elsewhere
(--node) and from a suspended NAME it goes through a snapshot. Only NAME's
owner may fork it. See docs/workspaces.md, "Forking a workspace".`,
		Example: `  kubectl bashtask workspace fork s1
  kubectl bashtask workspace fork s1 --count 8 --name-prefix try-`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workspaceFork(cmd.Context(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.count, "count", 1, fmt.Sprintf("how many copies to make, 1 to %d", btclient.MaxForkCount))
	fl.StringVar(&f.namePrefix, "name-prefix", "", "the copies' metadata.generateName: the name prefix the API server adds 5 random characters to (default NAME-fork-)")
	fl.StringVar(&f.node, "node", "", "spec.nodeName: make the copies on this node, through a snapshot (default: NAME's node, a local copy)")
	fl.DurationVar(&f.wait, "wait", time.Minute, "how long to wait for every copy to be Ready; 0 returns at once")
	return cmd
}

// workspaceFork makes the copies and prints one line for each.
func (a *app) workspaceFork(ctx context.Context, source string, f workspaceForkFlags) error {
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	_, bc, ns, err := a.clients()
	if err != nil {
		return err
	}
	opts, err := forkOptions(ns, source, f)
	if err != nil {
		return err
	}
	if f.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.wait)
		defer cancel()
	}
	forks, err := bc.Fork(ctx, opts)
	for _, ws := range forks {
		fmt.Fprintln(a.opts.IOStreams.Out, forkLine(ws))
	}
	if err != nil {
		return fmt.Errorf("forking workspace %s/%s: %w", ns, source, err)
	}
	return nil
}

// forkLine is the line printed for one copy.
func forkLine(ws *bashtaskv1alpha1.BashWorkspace) string {
	f := ws.Status.ForkedFrom
	if ptr.Deref(ws.Status.Phase, "") != bashtaskv1alpha1.WorkspaceReady || f == nil {
		return fmt.Sprintf("bashworkspace/%s created", ws.Name)
	}
	return fmt.Sprintf("bashworkspace/%s ready on %s (uid %d), forked from %s by %s, source frozen %s", ws.Name,
		ptr.Deref(ws.Status.NodeName, "?"), ptr.Deref(ws.Status.RunAsUser, -1), ptr.Deref(f.Workspace, "?"),
		ptr.Deref(f.Method, "?"), time.Duration(ptr.Deref(f.FrozenMicroseconds, 0))*time.Microsecond)
}
