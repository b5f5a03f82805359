package plugin

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ownerField is the selectable field of spec.owner, served by the API
// server itself (the CRD's selectableFields).
const ownerField = "spec.owner"

type getFlags struct {
	owner         string
	selector      string
	allNamespaces bool
}

func (a *app) getCommand() *cobra.Command {
	var f getFlags
	cmd := &cobra.Command{
		Use:   "get [NAME...]",
		Short: "List tasks with their phase, reason, exit code, node, owner, duration and age",
		Long: `Get prints a table of tasks: NAME, PHASE, REASON, EXIT, NODE, OWNER, DURATION
(from start to completion, or until now while running) and AGE. Without names
it lists the namespace's tasks, filtered by --owner (the API server's field
selector spec.owner) and -l (labels). A task named that was the first in a
workspace restored from a snapshot gets a line on stderr saying so.`,
		Example: `  kubectl bashtask get
  kubectl bashtask get --owner session-42
  kubectl bashtask get -A -l team=data`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd.Context(), args, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.owner, "owner", "", "only tasks whose spec.owner is this")
	fl.StringVarP(&f.selector, "selector", "l", "", "label selector, e.g. team=data,tier!=test")
	fl.BoolVarP(&f.allNamespaces, "all-namespaces", "A", false, "list tasks of every namespace")
	return cmd
}

func (a *app) get(ctx context.Context, names []string, f getFlags) error {
	if len(names) > 0 && (f.owner != "" || f.selector != "" || f.allNamespaces) {
		return fmt.Errorf("--owner, -l and -A select from a list; they cannot be combined with names")
	}
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	c, ns, err := a.client()
	if err != nil {
		return err
	}
	var items []bashtaskv1alpha1.BashTask
	if len(names) > 0 {
		for _, name := range names {
			var bt bashtaskv1alpha1.BashTask
			if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &bt); err != nil {
				return fmt.Errorf("reading task %s/%s: %w", ns, name, err)
			}
			items = append(items, bt)
		}
	} else {
		opts := []client.ListOption{}
		if !f.allNamespaces {
			opts = append(opts, client.InNamespace(ns))
		}
		if f.owner != "" {
			opts = append(opts, client.MatchingFields{ownerField: f.owner})
		}
		if f.selector != "" {
			sel, err := labels.Parse(f.selector)
			if err != nil {
				return fmt.Errorf("-l %q: %w", f.selector, err)
			}
			opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
		}
		var list bashtaskv1alpha1.BashTaskList
		if err := c.List(ctx, &list, opts...); err != nil {
			return fmt.Errorf("listing tasks: %w", err)
		}
		items = list.Items
	}
	if len(items) == 0 {
		if f.allNamespaces {
			a.note("no tasks found")
		} else {
			a.note("no tasks found in namespace %s", ns)
		}
		return nil
	}
	if err := printTable(a.opts.IOStreams.Out, items, a.opts.Now(), f.allNamespaces); err != nil {
		return err
	}
	if len(names) > 0 {
		// A task named on its own: the restore notice it carries, as run
		// prints it.
		for i := range items {
			if n := restoreNote(&items[i]); n != "" {
				a.note("%s: %s", items[i].Name, n)
			}
		}
	}
	return nil
}

// printTable writes tasks as kubectl prints resources: aligned columns,
// <none> for what a task does not have (yet).
func printTable(out io.Writer, items []bashtaskv1alpha1.BashTask, now time.Time, withNamespace bool) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	if withNamespace {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "NAME\tPHASE\tREASON\tEXIT\tNODE\tOWNER\tDURATION\tAGE")
	for i := range items {
		bt := &items[i]
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", bt.Namespace)
		}
		exit := ""
		if bt.Status.ExitCode != nil {
			exit = strconv.Itoa(int(*bt.Status.ExitCode))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", bt.Name,
			orNone(string(ptr.Deref(bt.Status.Phase, ""))), orNone(string(ptr.Deref(bt.Status.Reason, ""))), orNone(exit),
			orNone(ptr.Deref(bt.Status.NodeName, "")), orNone(ptr.Deref(bt.Spec.Owner, "")), runDuration(bt, now),
			duration.HumanDuration(now.Sub(bt.CreationTimestamp.Time)))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the table: %w", err)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// runDuration is how long the command ran: start to completion, or start
// to now while it runs. Status times have whole seconds, so a quick
// command shows 0s.
func runDuration(bt *bashtaskv1alpha1.BashTask, now time.Time) string {
	if bt.Status.StartTime == nil {
		return "<none>"
	}
	end := now
	if bt.Status.CompletionTime != nil {
		end = bt.Status.CompletionTime.Time
	}
	return duration.HumanDuration(max(end.Sub(bt.Status.StartTime.Time), 0))
}
