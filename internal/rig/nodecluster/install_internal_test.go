package nodecluster

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func waiting(reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: "agent", State: corev1.ContainerState{
		Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "failed to sync secret cache"},
	}}
}

// TestStuckWaiting checks that a release's wait rides out the reasons the
// kubelet retries (a Secret cache that has not synced when a release is
// installed again right after its uninstall) and gives up on them only
// after stuckWaitingGrace, and at once on a reason no retry changes.
func TestStuckWaiting(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 15, 25, 0, 0, time.UTC)
	isStop := func(err error) bool {
		var s stopWaiting
		return errors.As(err, &s)
	}
	for _, reason := range []string{"CreateContainerConfigError", "CreateContainerError", "ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff"} {
		s := stuckWaiting{since: map[string]time.Time{}}
		if err := s.check(t0, "ns", "p", waiting(reason)); err == nil || isStop(err) {
			t.Errorf("%s first seen: %v, want an error to wait on", reason, err)
		}
		if err := s.check(t0.Add(stuckWaitingGrace), "ns", "p", waiting(reason)); err == nil || isStop(err) {
			t.Errorf("%s after the grace exactly: %v, want an error to wait on", reason, err)
		}
		if err := s.check(t0.Add(stuckWaitingGrace+time.Second), "ns", "p", waiting(reason)); !isStop(err) {
			t.Errorf("%s past the grace: %v, want the wait to stop", reason, err)
		}
		// Another pod (the DaemonSet's next one) starts its own clock.
		if err := s.check(t0.Add(stuckWaitingGrace+time.Second), "ns", "q", waiting(reason)); err == nil || isStop(err) {
			t.Errorf("%s of another pod: %v, want an error to wait on", reason, err)
		}
	}
	for _, reason := range []string{"ErrImageNeverPull", "InvalidImageName"} {
		s := stuckWaiting{since: map[string]time.Time{}}
		if err := s.check(t0, "ns", "p", waiting(reason)); !isStop(err) {
			t.Errorf("%s: %v, want the wait to stop at once", reason, err)
		}
	}
	s := stuckWaiting{since: map[string]time.Time{}}
	for _, st := range []corev1.ContainerStatus{waiting("ContainerCreating"), {Name: "agent", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}} {
		if err := s.check(t0, "ns", "p", st); err != nil {
			t.Errorf("%+v: %v, want nil", st.State, err)
		}
	}
}
