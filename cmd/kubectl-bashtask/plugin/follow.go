package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// errTaskDeleted means the task was deleted while it was followed. Every
// error for that wraps it; run, wait and logs -f exit ExitPluginError.
var errTaskDeleted = errors.New("the task was deleted while it was followed")

// deletedError is errTaskDeleted with the last state seen of the task, so
// that the message also says how it ended, if it did: deleting a running
// task cancels it before the object goes, and that ending is worth telling.
type deletedError struct {
	key  types.NamespacedName
	last *bashtaskv1alpha1.BashTask // nil when never seen
}

func (e *deletedError) Error() string {
	msg := fmt.Sprintf("task %s was deleted while it was followed", e.key)
	if e.last == nil || !isFinished(e.last) {
		return msg + ", before it ended"
	}
	st := e.last.Status
	msg += "; it ended " + string(ptr.Deref(st.Reason, ""))
	if st.ExitCode != nil {
		msg += fmt.Sprintf(" (exit code %d)", *st.ExitCode)
	}
	if m := ptr.Deref(st.Message, ""); m != "" {
		msg += ": " + m
	}
	return msg
}

func (e *deletedError) Unwrap() error { return errTaskDeleted }

// endedByDeletion reports whether bt is being deleted and did not end
// before that: it is either still running (the controller is cancelling
// it) or ended no earlier than the deletion began, so the deletion ended
// it. Status times have whole seconds; an ending in the second of the
// deletion counts as caused by it.
func endedByDeletion(bt *bashtaskv1alpha1.BashTask) bool {
	if bt.DeletionTimestamp == nil {
		return false
	}
	if !isFinished(bt) || bt.Status.CompletionTime == nil {
		return true
	}
	return !bt.Status.CompletionTime.Before(bt.DeletionTimestamp)
}

// observeFunc sees the task's latest state and reports whether following
// is done.
type observeFunc func(bt *bashtaskv1alpha1.BashTask) (done bool, err error)

// interruptFunc handles an interrupt while a task is followed; an error
// ends the following.
type interruptFunc func(ctx context.Context) error

// watchTask calls observe with the task's state now and after each change
// until observe is done or fails, ctx ends, or the task is deleted.
// Whenever a watch ends (the API server closes watches after a while, and
// an expired resourceVersion cannot be resumed) it reads the task again and
// watches from there: observe always sees the latest state, if not every
// intermediate one, which is all that following a status needs. interrupts
// may be nil.
//
// A task deleted while it is followed ends the following with a
// *deletedError, also when the controller first wrote the Cancelled ending
// the deletion caused: that the task was deleted is the news, not that it
// was cancelled (kubectl wait --for=delete, by contrast, waits for the
// object to go; docs/kubectl-plugin.md).
func watchTask(ctx context.Context, c client.WithWatch, key types.NamespacedName, interrupts <-chan os.Signal, onInterrupt interruptFunc, observe observeFunc) error {
	return watchTaskFrom(ctx, c, key, nil, interrupts, onInterrupt, observe)
}

// watchTaskFrom is watchTask that starts from created, the task as its
// create returned it, when that is not nil: the first watch opens at its
// resourceVersion without a read before, so that no change after the
// create is missed and none costs a round trip.
func watchTaskFrom(ctx context.Context, c client.WithWatch, key types.NamespacedName, created *bashtaskv1alpha1.BashTask,
	interrupts <-chan os.Signal, onInterrupt interruptFunc, observe observeFunc) error {
	backoff := 100 * time.Millisecond
	var last *bashtaskv1alpha1.BashTask
	inner := observe
	observe = func(bt *bashtaskv1alpha1.BashTask) (bool, error) {
		last = bt
		done, err := inner(bt)
		if err != nil || !endedByDeletion(bt) {
			return done, err
		}
		if isFinished(bt) {
			// The object goes once the controller drops its finalizer;
			// waiting for that would tell nothing more.
			return true, &deletedError{key: key, last: bt}
		}
		return false, nil
	}
	for {
		bt := created
		created = nil
		if bt == nil {
			bt = &bashtaskv1alpha1.BashTask{}
			if err := c.Get(ctx, key, bt); err != nil {
				if last != nil && apierrors.IsNotFound(err) {
					return &deletedError{key: key, last: last}
				}
				return fmt.Errorf("reading task %s: %w", key, err)
			}
		}
		if done, err := observe(bt); done || err != nil {
			return err
		}
		w, err := c.Watch(ctx, &bashtaskv1alpha1.BashTaskList{}, &client.ListOptions{
			Namespace:     key.Namespace,
			FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name),
			Raw:           &metav1.ListOptions{ResourceVersion: bt.ResourceVersion},
		})
		if err != nil {
			return fmt.Errorf("watching task %s: %w", key, err)
		}
		done, err := drainWatch(ctx, w, interrupts, onInterrupt, observe)
		w.Stop()
		if errors.Is(err, errTaskDeleted) && !errors.As(err, new(*deletedError)) {
			return &deletedError{key: key, last: last}
		}
		if done || err != nil {
			return err
		}
		// The watch ended early: read again, without spinning when the
		// server keeps closing watches at once.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// drainWatch feeds one watch's events to observe until it is done, the
// watch ends (done false, no error) or something fails.
func drainWatch(ctx context.Context, w watch.Interface, interrupts <-chan os.Signal, onInterrupt interruptFunc, observe observeFunc) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-interrupts:
			if err := onInterrupt(ctx); err != nil {
				return false, err
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				bt, ok := ev.Object.(*bashtaskv1alpha1.BashTask)
				if !ok {
					continue
				}
				if done, err := observe(bt); done || err != nil {
					return done, err
				}
			case watch.Deleted:
				return false, errTaskDeleted
			case watch.Error:
				// Usually 410 Gone: the caller starts over from a fresh read.
				return false, nil
			}
		}
	}
}

// isFinished reports whether the task reached its terminal phase.
func isFinished(bt *bashtaskv1alpha1.BashTask) bool {
	phase := ptr.Deref(bt.Status.Phase, "")
	return phase == bashtaskv1alpha1.PhaseSucceeded || phase == bashtaskv1alpha1.PhaseFailed
}

// taskExit maps a finished task to the plugin's exit status, and to a
// message for every ending other than success or a plain non-zero exit.
func taskExit(bt *bashtaskv1alpha1.BashTask) (int, string) {
	st := bt.Status
	reason := ptr.Deref(st.Reason, "")
	if reason == bashtaskv1alpha1.ReasonSucceeded {
		return ExitOK, ""
	}
	code := ExitFailure
	// A task can have an exit code and still not have ended by exiting:
	// a command that traps SIGTERM on timeout and exits 0 is TimedOut.
	// Such a 0 must not read as success.
	if st.ExitCode != nil && *st.ExitCode > 0 && *st.ExitCode <= 255 {
		code = int(*st.ExitCode)
	}
	if reason == bashtaskv1alpha1.ReasonNonZeroExit && code == int(ptr.Deref(st.ExitCode, 0)) {
		return code, ""
	}
	msg := fmt.Sprintf("task %s/%s ended %s", bt.Namespace, bt.Name, reason)
	if m := ptr.Deref(st.Message, ""); m != "" {
		msg += ": " + m
	}
	return code, msg
}
