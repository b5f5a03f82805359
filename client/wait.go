package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// SilentWaitNote is how long after the create a task may stay without a
// word from the controller before Run notes it: under 2 s, so that a
// caller learns within 2 s why its command is not running yet, also when
// the reason is that no controller answers.
const SilentWaitNote = 1500 * time.Millisecond

// ErrTaskDeleted is returned by Run and Wait when the task was deleted
// before it ended.
var ErrTaskDeleted = errors.New("the BashTask was deleted before it ended")

// WaitTimeoutError is Run's and Wait's error when RunOptions.WaitTimeout
// passed before the task ended: the task was asked to cancel
// (spec.cancelRequested), and it ends Cancelled soon after.
type WaitTimeoutError struct {
	// Namespace and Name name the task.
	Namespace, Name string
	// Waited is how long the wait lasted, from the create (Run) or the
	// call (Wait).
	Waited time.Duration
	// Phase is the task's phase when the wait ended; Pending with the
	// Scheduled=False reason in Why when it never started.
	Phase bashtaskv1alpha1.Phase
	// Why is the reason and message of the last wait seen, empty when
	// the task was dispatched.
	Why string
	// CancelErr is the error of the cancel request, nil when it was sent.
	CancelErr error
}

func (e *WaitTimeoutError) Error() string {
	msg := fmt.Sprintf("task %s/%s did not end within the wait bound of %s: it was still %s", e.Namespace, e.Name, e.Waited.Round(time.Millisecond), e.Phase)
	if e.Why != "" {
		msg += " (" + e.Why + ")"
	}
	if e.CancelErr != nil {
		return msg + "; cancelling it failed: " + e.CancelErr.Error()
	}
	return msg + "; it was asked to cancel"
}

func (e *WaitTimeoutError) Unwrap() error { return e.CancelErr }

// PendingNote says why task is not running yet, from the Scheduled=False
// condition the controller writes while it waits (a workspace not found
// or not Ready, no agent, the owner's limit, a missing reference): its
// reason, and the line to show. ok is false when the task is not waiting
// for a reason (dispatched, ended, or not looked at yet).
func PendingNote(task *bashtaskv1alpha1.BashTask) (reason, line string, ok bool) {
	if task.Status.Reason != nil || ptr.Deref(task.Status.NodeName, "") != "" {
		return "", "", false
	}
	c := meta.FindStatusCondition(task.Status.Conditions, bashtaskv1alpha1.ConditionScheduled)
	if c == nil || c.Status != metav1.ConditionFalse {
		return "", "", false
	}
	return c.Reason, fmt.Sprintf("task %s is not running yet: %s: %s", task.Name, c.Reason, c.Message), true
}

// RestoreNote is the note of the first task on a workspace copy restored
// from a snapshot (its WorkspaceRestored condition, docs/workspaces.md):
// which node, how old the snapshot was and, after a node loss, that what
// was written after it is gone. ok is false for any other task.
func RestoreNote(task *bashtaskv1alpha1.BashTask) (line string, ok bool) {
	c := meta.FindStatusCondition(task.Status.Conditions, bashtaskv1alpha1.ConditionWorkspaceRestored)
	if c == nil || c.Status != metav1.ConditionTrue {
		return "", false
	}
	return fmt.Sprintf("task %s: %s", task.Name, c.Message), true
}

// SilentNote is the note of a task the controller has neither dispatched
// nor said anything about for after (SilentWaitNote, when Run notes it).
func SilentNote(task *bashtaskv1alpha1.BashTask, after time.Duration) string {
	return fmt.Sprintf("task %s is not running yet: the controller has not scheduled it %s after its create (is bashtask-controller running?)",
		task.Name, after.Round(100*time.Millisecond))
}

// runWait is one wait for a task's end: a watch of the task from the
// resourceVersion last seen, the notes, and the bound.
type runWait struct {
	c     *Client
	task  *bashtaskv1alpha1.BashTask // the latest state seen
	notes io.Writer
	start time.Time
	bound time.Duration
	// noted holds the Scheduled reasons already noted.
	noted map[string]bool
	// why is the last wait's note, for a WaitTimeoutError.
	why string
	// restored is true once the restore notice was noted.
	restored bool
}

func (w *runWait) note(line string) {
	if w.notes != nil {
		fmt.Fprintln(w.notes, line)
	}
}

// observe takes a new state of the task and notes a new reason to wait,
// and the restore of the workspace copy it runs on.
func (w *runWait) observe(t *bashtaskv1alpha1.BashTask) {
	w.task = t
	if line, ok := RestoreNote(t); ok && !w.restored {
		w.restored = true
		w.note(line)
	}
	reason, line, ok := PendingNote(t)
	if !ok {
		if t.Status.NodeName != nil {
			w.why = ""
		}
		return
	}
	w.why = reason
	if !w.noted[reason] {
		if w.noted == nil {
			w.noted = map[string]bool{}
		}
		w.noted[reason] = true
		w.note(line)
	}
}

// run waits for the end and the output, within the bound.
func (w *runWait) run(ctx context.Context, stdout, stderr io.Writer) (*Result, error) {
	wctx := ctx
	if w.bound > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, w.start.Add(w.bound))
		defer cancel()
	}
	var out *outputFollow
	if stdout != nil || stderr != nil {
		out = w.c.followOutput(wctx, w.task, stdout, stderr)
		defer out.stop()
	}
	final, err := w.watch(wctx)
	var res *Result
	if err == nil {
		res = resultOf(final)
		if out != nil {
			res.StdoutBytes, res.StderrBytes, err = out.finish(wctx, final)
		}
	}
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		if res == nil {
			return nil, w.timedOut()
		}
		// Ended, but its output was not all read within the bound.
		return res, fmt.Errorf("task %s/%s ended, but its output was not read whole within the wait bound of %s: %w",
			final.Namespace, final.Name, w.bound, err)
	}
	if res != nil && res.LeftoverProcesses > 0 {
		w.note(fmt.Sprintf("task %s: the command left %d processes running when it ended; they were stopped. "+
			"Start a long-lived service as a task of its own (Start, or kubectl bashtask run --detach)", final.Name, res.LeftoverProcesses))
	}
	return res, err
}

// timedOut cancels the task once the bound passed and says how long it
// waited and in what state the task was.
func (w *runWait) timedOut() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := &WaitTimeoutError{Namespace: w.task.Namespace, Name: w.task.Name, Waited: time.Since(w.start),
		Phase: ptr.Deref(w.task.Status.Phase, bashtaskv1alpha1.PhasePending), Why: w.why}
	e.CancelErr = w.c.Cancel(ctx, w.task.Namespace, w.task.Name, w.task.UID)
	return e
}

func resultOf(t *bashtaskv1alpha1.BashTask) *Result {
	return &Result{Task: t, ExitCode: int(ptr.Deref(t.Status.ExitCode, -1)), Reason: ptr.Deref(t.Status.Reason, ""),
		Message: ptr.Deref(t.Status.Message, ""), LeftoverProcesses: int(ptr.Deref(t.Status.LeftoverProcesses, 0))}
}

// watch follows the task with one watch (field selector on its name, from
// the resourceVersion last seen) until its terminal reason, noting why it
// waits. A watch the server ends is opened again from the last version
// seen; one whose version expired (410) starts again from a read.
func (w *runWait) watch(ctx context.Context) (*bashtaskv1alpha1.BashTask, error) {
	w.observe(w.task)
	silent := time.NewTimer(max(0, SilentWaitNote-time.Since(w.start)))
	defer silent.Stop()
	backoff := 50 * time.Millisecond
	for w.task.Status.Reason == nil {
		wi, err := w.c.k8s.Watch(ctx, &bashtaskv1alpha1.BashTaskList{}, &ctrlclient.ListOptions{
			Namespace:     w.task.Namespace,
			FieldSelector: fields.OneTermEqualSelector("metadata.name", w.task.Name),
			Raw:           &metav1.ListOptions{ResourceVersion: w.task.ResourceVersion, AllowWatchBookmarks: true},
		})
		if err != nil {
			return nil, fmt.Errorf("watching task %s/%s: %w", w.task.Namespace, w.task.Name, err)
		}
		progressed, err := w.drain(ctx, wi, silent.C)
		wi.Stop()
		switch {
		case errors.Is(err, errWatchExpired):
			err = w.reread(ctx)
		case err == nil && !progressed:
			// Closed at once: do not spin.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
		if err != nil {
			return nil, err
		}
	}
	return w.task, nil
}

// errWatchExpired is a watch whose resourceVersion is too old to resume.
var errWatchExpired = errors.New("the watch's resourceVersion expired")

// drain reads one watch until the task's end (nil), the watch's end (nil,
// progressed says whether it brought anything) or an error.
func (w *runWait) drain(ctx context.Context, wi watch.Interface, silent <-chan time.Time) (progressed bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return progressed, ctx.Err()
		case <-silent:
			if len(w.noted) == 0 && w.task.Status.NodeName == nil && w.task.Status.Reason == nil {
				w.note(SilentNote(w.task, time.Since(w.start)))
			}
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return progressed, nil
			}
			progressed = true
			if done, err := w.event(ev); done || err != nil {
				return true, err
			}
		}
	}
}

// event takes one watch event; done once the task has ended.
func (w *runWait) event(ev watch.Event) (bool, error) {
	switch ev.Type {
	case watch.Error:
		if apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) || apierrors.IsGone(apierrors.FromObject(ev.Object)) {
			return false, errWatchExpired
		}
		return false, fmt.Errorf("watching task %s/%s: %w", w.task.Namespace, w.task.Name, apierrors.FromObject(ev.Object))
	case watch.Deleted:
		return false, fmt.Errorf("task %s/%s: %w", w.task.Namespace, w.task.Name, ErrTaskDeleted)
	}
	t, ok := ev.Object.(*bashtaskv1alpha1.BashTask)
	if !ok {
		return false, nil
	}
	if ev.Type == watch.Bookmark {
		w.task.ResourceVersion = t.ResourceVersion
		return false, nil
	}
	if t.UID != w.task.UID {
		return false, fmt.Errorf("task %s/%s: %w", w.task.Namespace, w.task.Name, ErrTaskReplaced)
	}
	w.observe(t)
	return t.Status.Reason != nil, nil
}

// reread reads the task again after its watch expired.
func (w *runWait) reread(ctx context.Context) error {
	var t bashtaskv1alpha1.BashTask
	err := w.c.k8s.Get(ctx, ctrlclient.ObjectKeyFromObject(w.task), &t)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("task %s/%s: %w", w.task.Namespace, w.task.Name, ErrTaskDeleted)
	case err != nil:
		return fmt.Errorf("reading task %s/%s: %w", w.task.Namespace, w.task.Name, err)
	case t.UID != w.task.UID:
		return fmt.Errorf("task %s/%s: %w", w.task.Namespace, w.task.Name, ErrTaskReplaced)
	}
	w.observe(&t)
	return nil
}
