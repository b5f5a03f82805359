package plugin

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestDeletedWhileFollowed(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	task := func(deleted *metav1.Time, reason bashtaskv1alpha1.Reason, completed *metav1.Time) *bashtaskv1alpha1.BashTask {
		bt := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", DeletionTimestamp: deleted}}
		if reason != "" {
			phase := bashtaskv1alpha1.PhaseFailed
			if reason == bashtaskv1alpha1.ReasonSucceeded {
				phase = bashtaskv1alpha1.PhaseSucceeded
			}
			bt.Status = bashtaskv1alpha1.BashTaskStatus{Phase: &phase, Reason: &reason, CompletionTime: completed, ExitCode: ptr.To[int32](143), Message: ptr.To("cancelled")}
		}
		return bt
	}
	tests := map[string]struct {
		bt          *bashtaskv1alpha1.BashTask
		wantDeleted bool
		wantMessage string
	}{
		"not deleted":                    {bt: task(nil, "", nil)},
		"running, deletion started":      {bt: task(at(0), "", nil), wantDeleted: true, wantMessage: "task ns/x was deleted while it was followed, before it ended"},
		"cancelled by the deletion":      {bt: task(at(0), bashtaskv1alpha1.ReasonCancelled, at(time.Second)), wantDeleted: true, wantMessage: "task ns/x was deleted while it was followed; it ended Cancelled (exit code 143): cancelled"},
		"ended in the deletion's second": {bt: task(at(0), bashtaskv1alpha1.ReasonCancelled, at(0)), wantDeleted: true, wantMessage: "task ns/x was deleted while it was followed; it ended Cancelled (exit code 143): cancelled"},
		"finished before, deleted after": {bt: task(at(time.Minute), bashtaskv1alpha1.ReasonSucceeded, at(0))},
		"finished, not deleted":          {bt: task(nil, bashtaskv1alpha1.ReasonSucceeded, at(0))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := endedByDeletion(tc.bt); got != tc.wantDeleted {
				t.Errorf("endedByDeletion = %v, want %v", got, tc.wantDeleted)
			}
			if tc.wantMessage == "" {
				return
			}
			err := &deletedError{key: types.NamespacedName{Namespace: "ns", Name: "x"}, last: tc.bt}
			if err.Error() != tc.wantMessage {
				t.Errorf("message %q, want %q", err.Error(), tc.wantMessage)
			}
		})
	}
}
