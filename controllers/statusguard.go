package controllers

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ErrStatusRegression is wrapped by the error writeStatus returns when the
// status it was about to write would move the task backwards: from Running
// to Pending, from a terminal phase to another phase, or to a lower
// observedGeneration. Nothing is written then; the pass fails and is
// retried from a fresh read.
var ErrStatusRegression = errors.New("status would go backwards")

// guardStatus keeps a status write from undoing what an earlier write
// recorded. old is the status the write was computed from (the object's
// status at the resourceVersion the write is conditional on); next is the
// status about to be written, and is changed in place.
//
// Terminal fields are written once: once old has a terminal reason, next
// takes old's reason, message, exitCode, signal and completionTime, and a
// startTime once set never changes. Those are restored rather than refused,
// so a pass that recomputed them from a later agent report (a recovered
// agent re-reporting the task) still writes its other changes (uploads,
// observedGeneration); restored names the fields that differed.
//
// A phase that goes back, or an observedGeneration that decreases, is
// refused with an error wrapping ErrStatusRegression: no pass computes
// either from a current view, so one means the view was stale.
func guardStatus(old, next *bashtaskv1alpha1.BashTaskStatus) (restored []string, err error) {
	if old.StartTime != nil && !equality.Semantic.DeepEqual(old.StartTime, next.StartTime) {
		restored = append(restored, "startTime")
		next.StartTime = old.StartTime.DeepCopy()
	}
	if reasonOf(old) != "" {
		type frozen struct {
			name string
			same bool
			set  func()
		}
		for _, f := range []frozen{
			{"reason", ptr.Equal(old.Reason, next.Reason), func() { next.Reason = ptr.To(*old.Reason) }},
			{"message", ptr.Equal(old.Message, next.Message), func() { next.Message = copyPtr(old.Message) }},
			{"exitCode", ptr.Equal(old.ExitCode, next.ExitCode), func() { next.ExitCode = copyPtr(old.ExitCode) }},
			{"signal", ptr.Equal(old.Signal, next.Signal), func() { next.Signal = copyPtr(old.Signal) }},
			{"completionTime", equality.Semantic.DeepEqual(old.CompletionTime, next.CompletionTime), func() { next.CompletionTime = old.CompletionTime.DeepCopy() }},
			{"phase", ptr.Equal(old.Phase, next.Phase), func() { next.Phase = copyPtr(old.Phase) }},
		} {
			if !f.same {
				restored = append(restored, f.name)
				f.set()
			}
		}
	}
	var problems []string
	if phaseOf(old) == bashtaskv1alpha1.PhaseRunning && phaseOf(next) != bashtaskv1alpha1.PhaseRunning && reasonOf(next) == "" {
		problems = append(problems, fmt.Sprintf("phase %s -> %q without a terminal reason", phaseOf(old), phaseOf(next)))
	}
	if o, n := ptr.Deref(old.ObservedGeneration, 0), ptr.Deref(next.ObservedGeneration, 0); n < o {
		problems = append(problems, fmt.Sprintf("observedGeneration %d -> %d", o, n))
	}
	if len(problems) > 0 {
		return restored, fmt.Errorf("%w: %s", ErrStatusRegression, strings.Join(problems, "; "))
	}
	return restored, nil
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
