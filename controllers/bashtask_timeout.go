package controllers

import (
	"fmt"
	"time"

	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// A task's time limits (docs/api.md, "Timeouts and grace periods"): the
// timeout and the kill grace period each come from one of two exclusive
// fields, whole seconds or milliseconds, and travel to the agent as a
// duration, so a 100 ms timeout is 100 ms on the node. A timeout over the
// controller's --max-timeout-seconds is refused before dispatch, never
// cut short.

// specLimit is a time limit as the spec gives it: the field that set it
// ("" when neither did), its value in the field's unit, and the duration.
type specLimit struct {
	field string
	value int32
	d     time.Duration
}

// taskTimeout is the task's timeout: spec.timeoutMilliseconds or
// spec.timeoutSeconds, and with neither DefaultTimeoutSeconds, lowered to
// capSeconds when that is positive and smaller (a default is the
// controller's choice, not the user's, so it never makes a task fail).
func taskTimeout(spec *bashtaskv1alpha1.BashTaskSpec, capSeconds int32) specLimit {
	switch {
	case spec.TimeoutMilliseconds != nil:
		ms := *spec.TimeoutMilliseconds
		return specLimit{field: "spec.timeoutMilliseconds", value: ms, d: time.Duration(ms) * time.Millisecond}
	case spec.TimeoutSeconds != nil:
		s := *spec.TimeoutSeconds
		return specLimit{field: "spec.timeoutSeconds", value: s, d: time.Duration(s) * time.Second}
	}
	s := int32(bashtaskv1alpha1.DefaultTimeoutSeconds)
	if capSeconds > 0 {
		s = min(s, capSeconds)
	}
	return specLimit{value: s, d: time.Duration(s) * time.Second}
}

// taskKillGrace is the task's grace period between SIGTERM and SIGKILL:
// spec.killGracePeriodMilliseconds or spec.killGracePeriodSeconds, and
// with neither DefaultKillGracePeriodSeconds. Zero is a grace period of
// none, which the agent honours (api/agent/v1 TaskSpec.kill_grace).
func taskKillGrace(spec *bashtaskv1alpha1.BashTaskSpec) time.Duration {
	if ms := spec.KillGracePeriodMilliseconds; ms != nil {
		return time.Duration(*ms) * time.Millisecond
	}
	return time.Duration(ptr.Deref(spec.KillGracePeriodSeconds, bashtaskv1alpha1.DefaultKillGracePeriodSeconds)) * time.Second
}

// timeoutOverCap says why the task's timeout is refused, naming the field,
// its value, the cap and the flag that sets it; "" when it is within
// capSeconds (--max-timeout-seconds; 0 or less is no cap).
func timeoutOverCap(spec *bashtaskv1alpha1.BashTaskSpec, capSeconds int32) string {
	t := taskTimeout(spec, capSeconds)
	capD := time.Duration(capSeconds) * time.Second
	if capSeconds <= 0 || t.d <= capD {
		return ""
	}
	most := fmt.Sprintf("%d seconds", capSeconds)
	if t.field == "spec.timeoutMilliseconds" {
		most = fmt.Sprintf("%d milliseconds", int64(capSeconds)*1000)
	}
	return fmt.Sprintf("%s is %d (%s), over the controller's cap of %d seconds (%s, its --max-timeout-seconds): the task is refused rather than cut short. Ask for at most %s, or have the controller's --max-timeout-seconds raised",
		t.field, t.value, t.d, capSeconds, capD, most)
}

// timeoutGate ends a task not yet dispatched whose timeout is over the
// controller's cap (InvalidSpec, see timeoutOverCap); nil when it is
// within it.
func timeoutGate(bt *bashtaskv1alpha1.BashTask, capSeconds int32, now time.Time) *taskDecision {
	if msg := timeoutOverCap(&bt.Spec, capSeconds); msg != "" {
		return endDecision(bt, bashtaskv1alpha1.ReasonInvalidSpec, msg, now)
	}
	return nil
}
