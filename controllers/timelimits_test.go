package controllers_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// A timeout over the controller's --max-timeout-seconds (600 in the
// rig) ends the task InvalidSpec before dispatch, naming the field, the
// value, the cap and the flag; it is never cut to the cap.
func TestTimeoutOverCapRefused(t *testing.T) {
	ns := newNamespace(t)
	capSeconds := controllers.DefaultOptions().MaxTimeoutSeconds
	tests := map[string]struct {
		mutate func(*v1.BashTask)
		want   []string
	}{
		"seconds": {
			mutate: func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To(capSeconds + 1) },
			want:   []string{"spec.timeoutSeconds is 601 (10m1s)", "cap of 600 seconds", "--max-timeout-seconds", "refused rather than cut short"},
		},
		"milliseconds": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.TimeoutSeconds = nil
				bt.Spec.TimeoutMilliseconds = ptr.To(capSeconds*1000 + 1)
			},
			want: []string{"spec.timeoutMilliseconds is 600001 (10m0.001s)", "cap of 600 seconds", "--max-timeout-seconds", "at most 600000 milliseconds"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bt := newTask(ns, "over-cap-"+name, "echo never", tc.mutate)
			create(t, bt)
			got := waitTerminal(t, bt)
			st := got.Status
			if ptr.Deref(st.Reason, "") != v1.ReasonInvalidSpec || st.NodeName != nil || st.StartTime != nil {
				t.Fatalf("reason %q on node %q: want InvalidSpec before dispatch; message %q", ptr.Deref(st.Reason, ""), ptr.Deref(st.NodeName, ""), ptr.Deref(st.Message, ""))
			}
			for _, w := range tc.want {
				if msg := ptr.Deref(st.Message, ""); !strings.Contains(msg, w) {
					t.Errorf("message does not say %q: %s", w, msg)
				}
			}
		})
	}
}

// timeoutMilliseconds and killGracePeriodMilliseconds reach the agent as
// asked: a command that ignores SIGTERM, with a 100 ms timeout and a
// 200 ms grace, ends TimedOut by SIGKILL, and the message gives the real
// timeout, 100ms, not a second.
func TestMillisecondTimeoutAndGrace(t *testing.T) {
	ns := newNamespace(t)
	bt := newTask(ns, "ms", "trap '' TERM; echo armed; sleep 30", func(bt *v1.BashTask) {
		bt.Spec.TimeoutSeconds, bt.Spec.KillGracePeriodSeconds = nil, nil
		bt.Spec.TimeoutMilliseconds = ptr.To[int32](100)
		bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](200)
	})
	begin := time.Now()
	create(t, bt)
	got := waitTerminal(t, bt)
	took := time.Since(begin)
	st := got.Status
	t.Logf("terminal %v after create: %s", took, ptr.Deref(st.Message, ""))
	if ptr.Deref(st.Reason, "") != v1.ReasonTimedOut || ptr.Deref(st.Signal, "") != "SIGKILL" {
		t.Fatalf("reason %q, signal %q: want TimedOut by SIGKILL; message %q", ptr.Deref(st.Reason, ""), ptr.Deref(st.Signal, ""), ptr.Deref(st.Message, ""))
	}
	if msg := ptr.Deref(st.Message, ""); !strings.Contains(msg, "timed out after 100ms") {
		t.Errorf("message %q does not give the real timeout, 100ms", msg)
	}
	// Create, dispatch and the status writes take their time too; a
	// whole second of timeout and one of grace would not fit.
	if took > 2*time.Second {
		t.Errorf("terminal %v after create, want well under the 2 s whole seconds would take", took)
	}
}
