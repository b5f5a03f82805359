package controllers

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestGuardStatus(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0).UTC())
	t1 := metav1.NewTime(time.Unix(1001, 0).UTC())
	t2 := metav1.NewTime(time.Unix(1002, 0).UTC())
	running := func() *bashtaskv1alpha1.BashTaskStatus {
		return &bashtaskv1alpha1.BashTaskStatus{Phase: ptr.To(bashtaskv1alpha1.PhaseRunning), StartTime: t0.DeepCopy(), ObservedGeneration: ptr.To[int64](2)}
	}
	finished := func() *bashtaskv1alpha1.BashTaskStatus {
		return &bashtaskv1alpha1.BashTaskStatus{
			Phase: ptr.To(bashtaskv1alpha1.PhaseFailed), Reason: ptr.To(bashtaskv1alpha1.ReasonNonZeroExit), Message: ptr.To("exit 3"),
			ExitCode: ptr.To[int32](3), StartTime: t0.DeepCopy(), CompletionTime: t1.DeepCopy(), ObservedGeneration: ptr.To[int64](2),
		}
	}
	tests := map[string]struct {
		old, next    *bashtaskv1alpha1.BashTaskStatus
		wantRestored []string
		wantErr      bool
	}{
		"running to finished": {old: running(), next: finished()},
		"finished, a later report would change every terminal field": {
			old: finished(),
			next: &bashtaskv1alpha1.BashTaskStatus{
				Phase: ptr.To(bashtaskv1alpha1.PhaseFailed), Reason: ptr.To(bashtaskv1alpha1.ReasonAgentRestarted), Message: ptr.To("restarted"),
				ExitCode: nil, Signal: ptr.To("SIGKILL"), StartTime: t1.DeepCopy(), CompletionTime: t2.DeepCopy(), ObservedGeneration: ptr.To[int64](3),
			},
			wantRestored: []string{"startTime", "reason", "message", "exitCode", "signal", "completionTime"},
		},
		"finished, phase would change": {
			old: finished(),
			next: func() *bashtaskv1alpha1.BashTaskStatus {
				s := finished()
				s.Phase = ptr.To(bashtaskv1alpha1.PhaseSucceeded)
				return s
			}(),
			wantRestored: []string{"phase"},
		},
		"running to pending": {
			old: running(),
			next: func() *bashtaskv1alpha1.BashTaskStatus {
				s := running()
				s.Phase = ptr.To(bashtaskv1alpha1.PhasePending)
				return s
			}(),
			wantErr: true,
		},
		"observedGeneration decreases": {
			old: running(),
			next: func() *bashtaskv1alpha1.BashTaskStatus {
				s := running()
				s.ObservedGeneration = ptr.To[int64](1)
				return s
			}(),
			wantErr: true,
		},
		"start time moves while running": {
			old:          running(),
			next:         func() *bashtaskv1alpha1.BashTaskStatus { s := running(); s.StartTime = t1.DeepCopy(); return s }(),
			wantRestored: []string{"startTime"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			restored, err := guardStatus(tc.old, tc.next)
			if diff := cmp.Diff(tc.wantRestored, restored); diff != "" {
				t.Errorf("restored fields (-want +got):\n%s", diff)
			}
			if got := errors.Is(err, ErrStatusRegression); got != tc.wantErr {
				t.Errorf("err %v, want a regression error: %v", err, tc.wantErr)
			}
			if len(tc.wantRestored) == 0 || tc.wantErr {
				return
			}
			// After the guard, the terminal fields are the old ones.
			o, n := tc.old, tc.next
			if !ptr.Equal(o.Reason, n.Reason) || !ptr.Equal(o.ExitCode, n.ExitCode) || !ptr.Equal(o.Signal, n.Signal) ||
				!ptr.Equal(o.Message, n.Message) || !ptr.Equal(o.Phase, n.Phase) || !o.StartTime.Equal(n.StartTime) || !o.CompletionTime.Equal(n.CompletionTime) {
				t.Errorf("terminal fields not kept: old %+v, written %+v", o, n)
			}
		})
	}
}
