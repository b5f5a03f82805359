package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// The agent gets the timeout and the grace period the spec asks for, to
// the millisecond, and never a timeout cut to the controller's cap.
func TestTaskTimeLimits(t *testing.T) {
	tests := map[string]struct {
		spec        bashtaskv1alpha1.BashTaskSpec
		capSeconds  int32
		wantTimeout time.Duration
		wantGrace   time.Duration
	}{
		"defaults":                       {capSeconds: 600, wantTimeout: 120 * time.Second, wantGrace: 3 * time.Second},
		"default lowered to a small cap": {capSeconds: 60, wantTimeout: time.Minute, wantGrace: 3 * time.Second},
		"default with no cap":            {wantTimeout: 120 * time.Second, wantGrace: 3 * time.Second},
		"seconds": {
			spec:       bashtaskv1alpha1.BashTaskSpec{TimeoutSeconds: ptr.To[int32](30), KillGracePeriodSeconds: ptr.To[int32](1)},
			capSeconds: 600, wantTimeout: 30 * time.Second, wantGrace: time.Second,
		},
		"milliseconds": {
			spec:       bashtaskv1alpha1.BashTaskSpec{TimeoutMilliseconds: ptr.To[int32](100), KillGracePeriodMilliseconds: ptr.To[int32](200)},
			capSeconds: 600, wantTimeout: 100 * time.Millisecond, wantGrace: 200 * time.Millisecond,
		},
		"no grace": {
			spec:       bashtaskv1alpha1.BashTaskSpec{KillGracePeriodMilliseconds: ptr.To[int32](0)},
			capSeconds: 600, wantTimeout: 120 * time.Second, wantGrace: 0,
		},
		"over the cap: not cut (the gate refuses it)": {
			spec:       bashtaskv1alpha1.BashTaskSpec{TimeoutSeconds: ptr.To[int32](3600)},
			capSeconds: 600, wantTimeout: time.Hour, wantGrace: 3 * time.Second,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &BashTaskReconciler{opts: Options{MaxTimeoutSeconds: tc.capSeconds}}
			bt := &bashtaskv1alpha1.BashTask{Spec: tc.spec}
			spec := r.taskSpec(bt, &resolvedInput{})
			if got := spec.GetTimeout().AsDuration(); got != tc.wantTimeout {
				t.Errorf("timeout = %s, want %s", got, tc.wantTimeout)
			}
			if spec.GetKillGrace() == nil {
				t.Fatal("kill_grace absent: the agent would take its default")
			}
			if got := spec.GetKillGrace().AsDuration(); got != tc.wantGrace {
				t.Errorf("kill grace = %s, want %s", got, tc.wantGrace)
			}
		})
	}
}

// A timeout over --max-timeout-seconds ends the task InvalidSpec before
// dispatch, with a message naming the field, the value, the cap and the
// flag; one at the cap, or with no cap, passes.
func TestTimeoutGate(t *testing.T) {
	tests := map[string]struct {
		spec       bashtaskv1alpha1.BashTaskSpec
		capSeconds int32
		want       []string // nil: passes the gate
	}{
		"at the cap":                   {spec: bashtaskv1alpha1.BashTaskSpec{TimeoutSeconds: ptr.To[int32](600)}, capSeconds: 600},
		"milliseconds at the cap":      {spec: bashtaskv1alpha1.BashTaskSpec{TimeoutMilliseconds: ptr.To[int32](600000)}, capSeconds: 600},
		"unset, cap under the default": {capSeconds: 60},
		"no cap":                       {spec: bashtaskv1alpha1.BashTaskSpec{TimeoutSeconds: ptr.To[int32](604800)}},
		"seconds over the cap": {
			spec: bashtaskv1alpha1.BashTaskSpec{TimeoutSeconds: ptr.To[int32](3600)}, capSeconds: 600,
			want: []string{"spec.timeoutSeconds is 3600 (1h0m0s)", "cap of 600 seconds (10m0s", "--max-timeout-seconds", "at most 600 seconds"},
		},
		"milliseconds over the cap": {
			spec: bashtaskv1alpha1.BashTaskSpec{TimeoutMilliseconds: ptr.To[int32](600001)}, capSeconds: 600,
			want: []string{"spec.timeoutMilliseconds is 600001 (10m0.001s)", "cap of 600 seconds", "--max-timeout-seconds", "at most 600000 milliseconds"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt := &bashtaskv1alpha1.BashTask{Spec: tc.spec}
			d := timeoutGate(bt, tc.capSeconds, t0)
			if tc.want == nil {
				if d != nil {
					t.Fatalf("refused: %s", ptr.Deref(bt.Status.Message, ""))
				}
				return
			}
			if d == nil || d.write != "terminal" || reasonOf(&bt.Status) != bashtaskv1alpha1.ReasonInvalidSpec {
				t.Fatalf("decision %+v, reason %q; want a terminal InvalidSpec", d, reasonOf(&bt.Status))
			}
			msg := ptr.Deref(bt.Status.Message, "")
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message does not say %q: %s", w, msg)
				}
			}
		})
	}
}
