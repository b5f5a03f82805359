package plugin

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func ended(reason bashtaskv1alpha1.Reason, exit *int32, message string) *bashtaskv1alpha1.BashTask {
	return &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"},
		Status:     bashtaskv1alpha1.BashTaskStatus{Reason: ptr.To(reason), ExitCode: exit, Message: optional(message)},
	}
}

func TestTaskExit(t *testing.T) {
	tests := map[string]struct {
		task     *bashtaskv1alpha1.BashTask
		wantCode int
		wantMsg  string
	}{
		"succeeded":              {task: ended(bashtaskv1alpha1.ReasonSucceeded, ptr.To[int32](0), ""), wantCode: 0},
		"non-zero exit, no note": {task: ended(bashtaskv1alpha1.ReasonNonZeroExit, ptr.To[int32](3), "NonZeroExit: exited 3"), wantCode: 3},
		"signaled passes 128+n": {
			task: ended(bashtaskv1alpha1.ReasonSignaled, ptr.To[int32](137), "killed by SIGKILL"), wantCode: 137,
			wantMsg: "task ns/t ended Signaled: killed by SIGKILL",
		},
		"timed out after trapping TERM and exiting 0 is not success": {
			task: ended(bashtaskv1alpha1.ReasonTimedOut, ptr.To[int32](0), ""), wantCode: 1, wantMsg: "task ns/t ended TimedOut",
		},
		"start failed without exit code": {
			task: ended(bashtaskv1alpha1.ReasonStartFailed, nil, "working directory missing"), wantCode: 1,
			wantMsg: "task ns/t ended StartFailed: working directory missing",
		},
		"agent lost": {task: ended(bashtaskv1alpha1.ReasonAgentLost, nil, ""), wantCode: 1, wantMsg: "task ns/t ended AgentLost"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, msg := taskExit(tc.task)
			if code != tc.wantCode || msg != tc.wantMsg {
				t.Errorf("taskExit = %d, %q; want %d, %q", code, msg, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestPrintTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(-ago))) }
	done := bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "done", CreationTimestamp: *at(3 * time.Hour)},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Owner: ptr.To("alice")},
		Status: bashtaskv1alpha1.BashTaskStatus{Phase: ptr.To(bashtaskv1alpha1.PhaseFailed), Reason: ptr.To(bashtaskv1alpha1.ReasonNonZeroExit),
			ExitCode: ptr.To[int32](2), NodeName: ptr.To("node-1"), StartTime: at(3*time.Hour - time.Second), CompletionTime: at(3*time.Hour - 95*time.Second)},
	}
	running := bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "running", CreationTimestamp: *at(40 * time.Second)},
		Status:     bashtaskv1alpha1.BashTaskStatus{Phase: ptr.To(bashtaskv1alpha1.PhaseRunning), NodeName: ptr.To("node-2"), StartTime: at(30 * time.Second)},
	}
	pending := bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "pending", CreationTimestamp: *at(time.Second)}}

	var out bytes.Buffer
	if err := printTable(&out, []bashtaskv1alpha1.BashTask{done, running, pending}, now, false); err != nil {
		t.Fatal(err)
	}
	want := `NAME      PHASE     REASON        EXIT     NODE     OWNER    DURATION   AGE
done      Failed    NonZeroExit   2        node-1   alice    94s        3h
running   Running   <none>        <none>   node-2   <none>   30s        40s
pending   <none>    <none>        <none>   <none>   <none>   <none>     1s
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}

	out.Reset()
	if err := printTable(&out, []bashtaskv1alpha1.BashTask{pending}, now, true); err != nil {
		t.Fatal(err)
	}
	want = `NAMESPACE   NAME      PHASE    REASON   EXIT     NODE     OWNER    DURATION   AGE
b           pending   <none>   <none>   <none>   <none>   <none>   <none>     1s
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("table with namespaces (-want +got):\n%s", diff)
	}
}
