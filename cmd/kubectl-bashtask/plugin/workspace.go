package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

type workspaceCreateFlags struct {
	owner       string
	node        string
	selector    []string
	storage     string
	network     string
	carryEnv    bool
	noCarryDir  bool
	idleTimeout time.Duration
	wait        time.Duration
	// snapshotEvery and snapshotAfterTask are spec.snapshot's
	// intervalSeconds and afterTaskSeconds; snapshotAfterTask is -1
	// when the flag is not given (the controller's default).
	snapshotEvery     time.Duration
	snapshotAfterTask time.Duration
	// image and imagePullSecrets are spec.image and
	// spec.imagePullSecrets.
	image            string
	imagePullSecrets []string
	// rootInside is spec.rootInside.
	rootInside bool
	egress     egressFlagValues
}

func (a *app) workspaceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "workspace",
		Aliases: []string{"ws"},
		Short:   "Create, list, fork, snapshot, suspend, resume and delete BashWorkspaces, the homes that a session's tasks share",
		Long: `A BashWorkspace is a session's home on one node: a directory with a size
limit, a UID leased for its life, a network its tasks share, and the working
directory (and optionally the exported environment) carried from one task to
the next. Tasks run in it with "kubectl bashtask run --workspace W".
See docs/workspaces.md.`,
	}
	cmd.AddCommand(a.workspaceCreateCommand(), a.workspaceGetCommand(), a.workspaceDeleteCommand(),
		a.workspaceSnapshotCommand(), a.workspaceSuspendCommand(), a.workspaceResumeCommand(),
		a.workspaceForkCommand())
	return cmd
}

func (a *app) workspaceCreateCommand() *cobra.Command {
	var f workspaceCreateFlags
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a workspace and wait until it is Ready",
		Example: `  kubectl bashtask workspace create s1 --owner session-1
  kubectl bashtask workspace create s2 --storage 2Gi --network None --carry-env --idle-timeout 2h
  kubectl bashtask workspace create s3 --snapshot-interval 10m --snapshot-after-task 1m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workspaceCreate(cmd.Context(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.owner, "owner", "", "spec.owner: only tasks of this owner may run in the workspace")
	fl.StringVar(&f.node, "node", "", "spec.nodeName: make the workspace on this node")
	fl.StringArrayVar(&f.selector, "node-selector", nil, "spec.nodeSelector entry KEY=VALUE (repeatable)")
	fl.StringVar(&f.storage, "storage", "", "spec.storage: size of the workspace's file system, e.g. 2Gi (default: the agent's)")
	fl.StringVar(&f.network, "network", "", "spec.network: Egress, None or Node (default: the agent's)")
	fl.BoolVar(&f.carryEnv, "carry-env", false, "carry the variables each task exports to the next task")
	fl.BoolVar(&f.noCarryDir, "no-carry-dir", false, "start every task at the workspace's root instead of where the last one ended")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", 0, "spec.idleTimeoutSeconds: after this long without a task, suspend the workspace to a snapshot "+
		"(its next task restores it), or delete it where the agents have no bucket to snapshot to (whole seconds)")
	fl.DurationVar(&f.wait, "wait", time.Minute, "how long to wait for Ready (an image's pull included); 0 returns at once")
	fl.StringVar(&f.image, "image", "", "spec.image: the OCI image the workspace's tasks run in, resolved to a digest once (default: the agent's default image, or the node's root)")
	fl.StringArrayVar(&f.imagePullSecrets, "image-pull-secret", nil, "spec.imagePullSecrets: a Secret of type kubernetes.io/dockerconfigjson whose credentials pull --image (repeatable)")
	fl.BoolVar(&f.rootInside, "root-inside", false, "spec.rootInside: run the tasks as uid 0 of a user namespace of their own, mapped to the workspace's UID, so that apt-get install works in the image")
	fl.DurationVar(&f.snapshotEvery, "snapshot-interval", 0, "spec.snapshot.intervalSeconds: snapshot this often while a task runs, 1m to 24h (whole seconds)")
	f.egress.add(fl)
	fl.DurationVar(&f.snapshotAfterTask, "snapshot-after-task", -1, "spec.snapshot.afterTaskSeconds: snapshot this long after the last task ended when a task changed the workspace, up to 24h (whole seconds); 0 turns it off (default: the controller's, 5m)")
	return cmd
}

// workspaceSpec builds the spec from the flags, checking each against the
// API's limits first so the error names the flag.
func workspaceSpec(f workspaceCreateFlags) (bashtaskv1alpha1.BashWorkspaceSpec, error) {
	spec := bashtaskv1alpha1.BashWorkspaceSpec{Owner: optional(f.owner), NodeName: optional(f.node)}
	if err := charLimit("--owner", "spec.owner", f.owner); err != nil {
		return spec, err
	}
	if err := charLimit("--node", "spec.nodeName", f.node); err != nil {
		return spec, err
	}
	for _, kv := range f.selector {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return spec, fmt.Errorf("--node-selector %q: want KEY=VALUE", kv)
		}
		if spec.NodeSelector == nil {
			spec.NodeSelector = map[string]string{}
		}
		spec.NodeSelector[k] = v
	}
	if f.storage != "" {
		q, err := resource.ParseQuantity(f.storage)
		if err != nil {
			return spec, fmt.Errorf("--storage %q: %w", f.storage, err)
		}
		spec.Storage = &q
	}
	if f.network != "" {
		n, err := parseNetwork(f.network)
		if err != nil {
			return spec, err
		}
		spec.Network = &n
	}
	if f.carryEnv || f.noCarryDir {
		spec.CarryOver = &bashtaskv1alpha1.CarryOver{WorkingDir: ptr.To(!f.noCarryDir), Environment: ptr.To(f.carryEnv)}
	}
	if f.idleTimeout != 0 {
		s := f.idleTimeout / time.Second
		if f.idleTimeout%time.Second != 0 || s < 1 || s > bashtaskv1alpha1.MaxIdleTimeoutSeconds {
			return spec, fmt.Errorf("--idle-timeout %s: whole seconds from 1s to %ds (spec.idleTimeoutSeconds)", f.idleTimeout, bashtaskv1alpha1.MaxIdleTimeoutSeconds)
		}
		spec.IdleTimeoutSeconds = ptr.To(int32(s))
	}
	image, secrets, err := imageFlags(f.image, f.imagePullSecrets)
	if err != nil {
		return spec, err
	}
	spec.Image, spec.ImagePullSecrets = image, secrets
	if f.rootInside {
		spec.RootInside = ptr.To(true)
	}
	if spec.Egress, err = f.egress.policy(); err != nil {
		return spec, err
	}
	if spec.Egress != nil {
		if spec.Network != nil && *spec.Network != bashtaskv1alpha1.NetworkEgress {
			return spec, fmt.Errorf("--egress-allow and --egress-deny need --network Egress, not %s", *spec.Network)
		}
		spec.Network = ptr.To(bashtaskv1alpha1.NetworkEgress)
	}
	snap, err := snapshotPolicy(f)
	spec.Snapshot = snap
	return spec, err
}

// snapshotPolicy is spec.snapshot from --snapshot-interval and
// --snapshot-after-task, nil when neither is given; each is checked
// against the API's limits.
func snapshotPolicy(f workspaceCreateFlags) (*bashtaskv1alpha1.WorkspaceSnapshotPolicy, error) {
	var pol bashtaskv1alpha1.WorkspaceSnapshotPolicy
	if d := f.snapshotEvery; d != 0 {
		if d%time.Second != 0 || d < time.Minute || d > 24*time.Hour {
			return nil, fmt.Errorf("--snapshot-interval %s: whole seconds from 1m to 24h (spec.snapshot.intervalSeconds)", d)
		}
		pol.IntervalSeconds = ptr.To(int32(d / time.Second))
	}
	if d := f.snapshotAfterTask; d != -1 {
		if d < 0 || d%time.Second != 0 || d > bashtaskv1alpha1.MaxSnapshotAfterTaskSeconds*time.Second {
			return nil, fmt.Errorf("--snapshot-after-task %s: whole seconds up to 24h, 0 for none (spec.snapshot.afterTaskSeconds)", d)
		}
		pol.AfterTaskSeconds = ptr.To(int32(d / time.Second))
	}
	if pol.IntervalSeconds == nil && pol.AfterTaskSeconds == nil {
		return nil, nil
	}
	return &pol, nil
}

// parseNetwork accepts the API's spelling of a network in any case.
func parseNetwork(s string) (bashtaskv1alpha1.TaskNetwork, error) {
	for _, n := range []bashtaskv1alpha1.TaskNetwork{bashtaskv1alpha1.NetworkEgress, bashtaskv1alpha1.NetworkNone, bashtaskv1alpha1.NetworkNode} {
		if strings.EqualFold(s, string(n)) {
			return n, nil
		}
	}
	return "", fmt.Errorf("--network %q: one of Egress, None, Node", s)
}

func (a *app) workspaceCreate(ctx context.Context, name string, f workspaceCreateFlags) error {
	spec, err := workspaceSpec(f)
	if err != nil {
		return err
	}
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, bc, ns, err := a.clients()
	if err != nil {
		return err
	}
	ws := &bashtaskv1alpha1.BashWorkspace{Spec: spec}
	ws.Namespace, ws.Name = ns, name
	if err := c.Create(ctx, ws); err != nil {
		return fmt.Errorf("creating workspace %s/%s: %w", ns, name, err)
	}
	if f.wait <= 0 {
		fmt.Fprintf(a.opts.IOStreams.Out, "bashworkspace/%s created\n", name)
		return nil
	}
	got, err := waitWorkspace(ctx, bc, ws, f.wait)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.opts.IOStreams.Out, "bashworkspace/%s ready on %s (uid %d, %s)\n", name,
		ptr.Deref(got.Status.NodeName, "?"), ptr.Deref(got.Status.RunAsUser, -1), ptr.Deref(got.Status.WorkingDir, bashtaskv1alpha1.WorkspacePath))
	return nil
}

// waitWorkspace waits, on a watch, until ws is Ready, or fails naming its
// phase and message when it is Failed or NodeLost, or when limit passes.
func waitWorkspace(ctx context.Context, bc *btclient.Client, ws *bashtaskv1alpha1.BashWorkspace, limit time.Duration) (*bashtaskv1alpha1.BashWorkspace, error) {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last *bashtaskv1alpha1.BashWorkspace
	got, err := bc.WaitWorkspace(wctx, ws.Namespace, ws.Name, func(w *bashtaskv1alpha1.BashWorkspace) bool {
		last = w
		return w.UID != ws.UID || ptr.Deref(w.Status.Phase, "") == bashtaskv1alpha1.WorkspaceReady
	})
	var fe *btclient.WorkspaceFailedError
	switch {
	case errors.As(err, &fe):
		return nil, fe
	case err != nil && wctx.Err() != nil && ctx.Err() == nil && last != nil:
		return nil, fmt.Errorf("workspace %s/%s is not Ready after %s (phase %s: %s)", ws.Namespace, ws.Name, limit,
			orNone(string(ptr.Deref(last.Status.Phase, ""))), ptr.Deref(last.Status.Message, ""))
	case err != nil:
		return nil, fmt.Errorf("waiting for workspace %s/%s: %w", ws.Namespace, ws.Name, err)
	case ws.UID != "" && got.UID != ws.UID:
		return nil, fmt.Errorf("workspace %s/%s was re-created while waiting", ws.Namespace, ws.Name)
	}
	return got, nil
}

func (a *app) workspaceGetCommand() *cobra.Command {
	var allNamespaces bool
	cmd := &cobra.Command{
		Use:   "get [NAME...]",
		Short: "List workspaces with their phase, node, running tasks, disk use and working directory",
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workspaceGet(cmd.Context(), args, allNamespaces)
		},
	}
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "list workspaces of every namespace")
	return cmd
}

func (a *app) workspaceGet(ctx context.Context, names []string, allNamespaces bool) error {
	if len(names) > 0 && allNamespaces {
		return errors.New("-A lists; it cannot be combined with names")
	}
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, ns, err := a.client()
	if err != nil {
		return err
	}
	var items []bashtaskv1alpha1.BashWorkspace
	if len(names) > 0 {
		for _, name := range names {
			var ws bashtaskv1alpha1.BashWorkspace
			if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ws); err != nil {
				return fmt.Errorf("reading workspace %s/%s: %w", ns, name, err)
			}
			items = append(items, ws)
		}
	} else {
		var list bashtaskv1alpha1.BashWorkspaceList
		var opts []client.ListOption
		if !allNamespaces {
			opts = append(opts, client.InNamespace(ns))
		}
		if err := c.List(ctx, &list, opts...); err != nil {
			return fmt.Errorf("listing workspaces: %w", err)
		}
		items = list.Items
	}
	if len(items) == 0 {
		a.note("no workspaces found")
		return nil
	}
	return printWorkspaces(a.opts.IOStreams.Out, items, a.opts.Now(), allNamespaces)
}

// printWorkspaces writes workspaces as kubectl prints resources.
func printWorkspaces(out io.Writer, items []bashtaskv1alpha1.BashWorkspace, now time.Time, withNamespace bool) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	if withNamespace {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "NAME\tPHASE\tNODE\tOWNER\tRUNNING\tUSED\tDIR\tIMAGE\tDIGEST\tSNAPSHOT\tAGE")
	for i := range items {
		ws := &items[i]
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", ws.Namespace)
		}
		used := "<none>"
		if ws.Status.UsedBytes != nil {
			used = resource.NewQuantity(*ws.Status.UsedBytes, resource.BinarySI).String()
			if ws.Status.CapacityBytes != nil {
				used += "/" + resource.NewQuantity(*ws.Status.CapacityBytes, resource.BinarySI).String()
			}
		}
		running := "<none>"
		if ws.Status.RunningTasks != nil {
			running = fmt.Sprint(*ws.Status.RunningTasks)
		}
		image, digest := workspaceImage(ws)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ws.Name,
			orNone(string(ptr.Deref(ws.Status.Phase, ""))), orNone(ptr.Deref(ws.Status.NodeName, "")),
			orNone(ptr.Deref(ws.Spec.Owner, "")), running, used, orNone(ptr.Deref(ws.Status.WorkingDir, "")),
			image, digest, snapshotAge(ws, now), duration.HumanDuration(now.Sub(ws.CreationTimestamp.Time)))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the table: %w", err)
	}
	return nil
}

// workspaceImage is a workspace's IMAGE and DIGEST columns: the image
// its tasks run in as recorded (status.image.requested, else spec.image)
// and the digest it resolved to, shortened to 12 hex digits as docker
// prints an image ID, or "pulling:N%" while its node pulls it; <none>
// for each that is not known. No value has a space, so that the columns
// split on white space.
func workspaceImage(ws *bashtaskv1alpha1.BashWorkspace) (image, digest string) {
	im := ptr.Deref(ws.Status.Image, bashtaskv1alpha1.ImageStatus{})
	image = ptr.Deref(im.Requested, string(ptr.Deref(ws.Spec.Image, "")))
	digest = ptr.Deref(im.Digest, "")
	if algo, hex, ok := strings.Cut(digest, ":"); ok && len(hex) > 12 {
		digest = algo + ":" + hex[:12]
	}
	if total := ptr.Deref(im.TotalBytes, 0); total > 0 && digest == "" {
		digest = fmt.Sprintf("pulling:%d%%", ptr.Deref(im.DownloadedBytes, 0)*100/total)
	}
	return orNone(image), orNone(digest)
}

func (a *app) workspaceDeleteCommand() *cobra.Command {
	var waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "delete NAME...",
		Short: "Delete workspaces: their running tasks are cancelled, then their files, network and UID go",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workspaceDelete(cmd.Context(), args, waitFor)
		},
	}
	cmd.Flags().DurationVar(&waitFor, "wait", time.Minute, "how long to wait until each workspace is gone; 0 returns at once")
	return cmd
}

func (a *app) workspaceDelete(ctx context.Context, names []string, waitFor time.Duration) error {
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, bc, ns, err := a.clients()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		ws := &bashtaskv1alpha1.BashWorkspace{}
		ws.Namespace, ws.Name = ns, name
		if err := c.Delete(ctx, ws); err != nil {
			errs = append(errs, fmt.Errorf("deleting workspace %s/%s: %w", ns, name, err))
			continue
		}
		if waitFor > 0 {
			wctx, cancel := context.WithTimeout(ctx, waitFor)
			_, err := bc.WaitWorkspace(wctx, ns, name, func(*bashtaskv1alpha1.BashWorkspace) bool { return false })
			cancel()
			var fe *btclient.WorkspaceFailedError
			if !errors.As(err, &fe) || fe.Phase != "" {
				errs = append(errs, fmt.Errorf("workspace %s/%s is not gone after %s: %w", ns, name, waitFor, err))
				continue
			}
		}
		fmt.Fprintf(a.opts.IOStreams.Out, "bashworkspace/%s deleted\n", name)
	}
	return errors.Join(errs...)
}
