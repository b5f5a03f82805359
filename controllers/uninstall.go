package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ReleaseOptions configure ReleaseTasks.
type ReleaseOptions struct {
	// Namespace limits the tasks released to one namespace; empty means
	// every namespace (what the uninstall hook does).
	Namespace string
	// Timeout bounds the wait for the cancelled tasks to end.
	Timeout time.Duration
	// Poll is the time between two looks at the tasks; zero means 1 s.
	Poll time.Duration
	// Clock measures Timeout and Poll.
	Clock clock.Clock
	// Logf receives one line per step; nil discards them.
	Logf func(format string, args ...any)
}

// ReleaseTasks prepares the cluster for the controller's removal (the
// chart runs it as a pre-delete hook of `helm uninstall`, while the
// controller and the agents still run). Once they are gone, nothing would
// stop a dispatched task's process cleanly or remove Finalizer, and
// deleting a task would hang forever. So it:
//
//  1. sets spec.cancelRequested on every task that is dispatched and not
//     finished (its process dies with the agents anyway; this way its
//     status says Cancelled, with its output);
//  2. waits until those tasks are terminal, at most o.Timeout;
//  3. removes Finalizer from every task, whatever its state;
//  4. removes WorkspaceFinalizer from every BashWorkspace, which stay
//     (see releaseWorkspaces).
//
// Tasks not yet dispatched stay as they are (Pending): a later install
// runs them. It returns the errors of every step; a timeout in step 2 is
// reported but step 3 still runs.
func ReleaseTasks(ctx context.Context, c client.Client, o ReleaseOptions) error {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var errs []error
	cancelled, err := cancelDispatched(ctx, c, o.Namespace)
	if err != nil {
		errs = append(errs, err)
	}
	logf("cancelled %d running tasks", cancelled)
	if cancelled > 0 {
		if err := waitNoneRunning(ctx, c, o, logf); err != nil {
			errs = append(errs, err)
		}
	}
	released, err := removeFinalizers(ctx, c, o.Namespace)
	if err != nil {
		errs = append(errs, err)
	}
	logf("removed the finalizer from %d tasks", released)
	kept, err := releaseWorkspaces(ctx, c, o.Namespace)
	if err != nil {
		errs = append(errs, err)
	}
	logf("removed the finalizer from %d workspaces; they stay on their nodes", kept)
	return errors.Join(errs...)
}

// releaseWorkspaces removes WorkspaceFinalizer from every BashWorkspace,
// with optimistic locking. The workspaces are not deleted: their files
// stay on their nodes, and a later install's controller finds them on
// their agents again. The controller adds the finalizer only to a
// workspace it has not placed yet, so it does not put it back.
func releaseWorkspaces(ctx context.Context, c client.Client, namespace string) (int, error) {
	var list bashtaskv1alpha1.BashWorkspaceList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0, fmt.Errorf("listing BashWorkspaces: %w", err)
	}
	n := 0
	var errs []error
	for i := range list.Items {
		ws := &list.Items[i]
		if !controllerutil.ContainsFinalizer(ws, WorkspaceFinalizer) {
			continue
		}
		patch := client.MergeFromWithOptions(ws.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(ws, WorkspaceFinalizer)
		if err := c.Patch(ctx, ws, patch); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("removing the finalizer of %s: %w", klog.KObj(ws), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// dispatchedUnfinished reports whether bt was handed to an agent and has
// no terminal reason yet.
func dispatchedUnfinished(bt *bashtaskv1alpha1.BashTask) bool {
	return ptr.Deref(bt.Status.NodeName, "") != "" && ptr.Deref(bt.Status.Reason, "") == ""
}

// cancelDispatched sets spec.cancelRequested on every dispatched,
// unfinished task not already cancelled.
func cancelDispatched(ctx context.Context, c client.Client, namespace string) (int, error) {
	return patchEach(ctx, c, namespace, "cancelling",
		func(bt *bashtaskv1alpha1.BashTask) bool {
			return dispatchedUnfinished(bt) && !ptr.Deref(bt.Spec.CancelRequested, false)
		},
		func(bt *bashtaskv1alpha1.BashTask) { bt.Spec.CancelRequested = ptr.To(true) },
		client.MergeFrom)
}

func waitNoneRunning(ctx context.Context, c client.Client, o ReleaseOptions, logf func(string, ...any)) error {
	deadline := o.Clock.Now().Add(o.Timeout)
	for {
		var list bashtaskv1alpha1.BashTaskList
		if err := c.List(ctx, &list, client.InNamespace(o.Namespace)); err != nil {
			return fmt.Errorf("listing BashTasks: %w", err)
		}
		var running []string
		for i := range list.Items {
			if bt := &list.Items[i]; dispatchedUnfinished(bt) {
				running = append(running, klog.KObj(bt).String())
			}
		}
		if len(running) == 0 {
			return nil
		}
		if !o.Clock.Now().Before(deadline) {
			return fmt.Errorf("%d tasks still running after %s: %v", len(running), o.Timeout, running)
		}
		logf("waiting for %d tasks to end", len(running))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.Clock.After(o.Poll):
		}
	}
}

// removeFinalizers removes Finalizer from every task that has it, with
// optimistic locking so a finalizer another party adds meanwhile is kept.
func removeFinalizers(ctx context.Context, c client.Client, namespace string) (int, error) {
	return patchEach(ctx, c, namespace, "removing the finalizer of",
		func(bt *bashtaskv1alpha1.BashTask) bool { return controllerutil.ContainsFinalizer(bt, Finalizer) },
		func(bt *bashtaskv1alpha1.BashTask) { controllerutil.RemoveFinalizer(bt, Finalizer) },
		func(obj client.Object) client.Patch {
			return client.MergeFromWithOptions(obj, client.MergeFromWithOptimisticLock{})
		})
}

// patchEach lists the tasks of namespace (empty: all) and, for each that
// match accepts, applies mutate as a merge patch made by newPatch from the
// task as listed. A task gone meanwhile is skipped; the other failures are
// joined, each naming the task after doing. It returns how many it patched.
func patchEach(ctx context.Context, c client.Client, namespace, doing string,
	match func(*bashtaskv1alpha1.BashTask) bool, mutate func(*bashtaskv1alpha1.BashTask),
	newPatch func(client.Object) client.Patch) (int, error) {
	var list bashtaskv1alpha1.BashTaskList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0, fmt.Errorf("listing BashTasks: %w", err)
	}
	n := 0
	var errs []error
	for i := range list.Items {
		bt := &list.Items[i]
		if !match(bt) {
			continue
		}
		patch := newPatch(bt.DeepCopy())
		mutate(bt)
		if err := c.Patch(ctx, bt, patch); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("%s %s: %w", doing, klog.KObj(bt), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
