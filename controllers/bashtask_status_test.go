package controllers

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestFitStatusBudget(t *testing.T) {
	binary := make([]byte, 100000)
	for i := range binary {
		binary[i] = byte(i % 32) // control bytes: six bytes each once escaped
	}
	tests := map[string]struct {
		stdout, stderr string
		budget         int
		wantTruncated  [2]bool
	}{
		"fits already":             {stdout: "hello\n", stderr: "err\n", budget: 4096},
		"long text stdout":         {stdout: strings.Repeat("line of text\n", 30000), budget: 65536, wantTruncated: [2]bool{true, false}},
		"control bytes":            {stdout: string(binary), budget: 65536, wantTruncated: [2]bool{true, false}},
		"multi-byte runes":         {stdout: strings.Repeat("日本語€", 20000), budget: 10000, wantTruncated: [2]bool{true, false}},
		"html-escaped characters":  {stdout: strings.Repeat("<&>", 40000), budget: 30000, wantTruncated: [2]bool{true, false}},
		"both streams large":       {stdout: strings.Repeat("o", 200000), stderr: strings.Repeat("e", 150000), budget: 100000, wantTruncated: [2]bool{true, true}},
		"one large one small kept": {stdout: strings.Repeat("o", 200000), stderr: "small\n", budget: 100000, wantTruncated: [2]bool{true, false}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := &bashtaskv1alpha1.BashTaskStatus{
				Phase:  ptr.To(bashtaskv1alpha1.PhaseSucceeded),
				Stdout: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To(tc.stdout), TotalBytes: ptr.To(int64(len(tc.stdout)))},
				Stderr: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To(tc.stderr), TotalBytes: ptr.To(int64(len(tc.stderr)))},
			}
			if err := FitStatusBudget(st, tc.budget); err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) > tc.budget {
				t.Errorf("encoded status is %d bytes, over the budget of %d", len(raw), tc.budget)
			}
			for i, s := range []struct {
				got  *bashtaskv1alpha1.StreamStatus
				orig string
			}{{st.Stdout, tc.stdout}, {st.Stderr, tc.stderr}} {
				tail := ptr.Deref(s.got.Tail, "")
				if !strings.HasSuffix(s.orig, tail) {
					t.Errorf("stream %d: tail is not a suffix of the output", i)
				}
				if !utf8.ValidString(tail) {
					t.Errorf("stream %d: tail is not valid UTF-8 after shortening", i)
				}
				if truncated := ptr.Deref(s.got.Truncated, false); truncated != tc.wantTruncated[i] {
					t.Errorf("stream %d: truncated = %v, want %v", i, truncated, tc.wantTruncated[i])
				}
			}
			// Shortening must not throw away far more than needed: the
			// result uses at least half the budget when it had to cut.
			if tc.wantTruncated != [2]bool{} && len(raw) < tc.budget/2 {
				t.Errorf("encoded status is %d bytes, less than half the budget of %d: cut too much", len(raw), tc.budget)
			}
		})
	}
}

func TestFitStatusBudgetImpossible(t *testing.T) {
	st := &bashtaskv1alpha1.BashTaskStatus{Message: ptr.To(strings.Repeat("m", 1000))}
	if err := FitStatusBudget(st, 100); err == nil {
		t.Fatal("want an error when the status cannot fit without tails")
	}
}

func FuzzFitStatusBudget(f *testing.F) {
	f.Add("hello\n", "world\n", 64)
	f.Add("\x00\x01<>&\u2028", "日本", 40)
	f.Fuzz(func(t *testing.T, out, errs string, budget int) {
		if budget < 200 || budget > 1<<20 {
			t.Skip("budget outside the range a status budget takes (200 B to 1 MiB)")
		}
		out = strings.ToValidUTF8(out, "\uFFFD")
		errs = strings.ToValidUTF8(errs, "\uFFFD")
		st := &bashtaskv1alpha1.BashTaskStatus{
			Stdout: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To(out)},
			Stderr: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To(errs)},
		}
		if err := FitStatusBudget(st, budget); err != nil {
			return // over budget with empty tails: nothing to check
		}
		raw, _ := json.Marshal(st)
		if len(raw) > budget {
			t.Fatalf("encoded %d bytes, budget %d", len(raw), budget)
		}
		if !strings.HasSuffix(out, ptr.Deref(st.Stdout.Tail, "")) || !strings.HasSuffix(errs, ptr.Deref(st.Stderr.Tail, "")) {
			t.Fatal("tail is not a suffix")
		}
	})
}

func TestSetReadiness(t *testing.T) {
	type cond struct{ status, reason string }
	scheduled := func(status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: bashtaskv1alpha1.ConditionScheduled, Status: status, Reason: reason, Message: "m"}
	}
	tests := map[string]struct {
		spec   bashtaskv1alpha1.BashTaskSpec
		status bashtaskv1alpha1.BashTaskStatus
		want   map[string]cond // Ready, Reconciling, Stalled; absent when not listed
	}{
		"new":                  {want: map[string]cond{"Ready": {"False", ReasonPending}, "Reconciling": {"True", ReasonPending}}},
		"waiting for an agent": {status: bashtaskv1alpha1.BashTaskStatus{Conditions: []metav1.Condition{scheduled(metav1.ConditionFalse, ReasonNoAgent)}}, want: map[string]cond{"Ready": {"False", ReasonPending}, "Reconciling": {"True", ReasonPending}}},
		"suspended":            {spec: bashtaskv1alpha1.BashTaskSpec{Suspend: ptr.To(true)}, want: map[string]cond{"Ready": {"False", ReasonSuspended}, "Reconciling": {"True", ReasonSuspended}}},
		"dispatched, not started": {
			status: bashtaskv1alpha1.BashTaskStatus{NodeName: ptr.To("n"), Conditions: []metav1.Condition{scheduled(metav1.ConditionTrue, ReasonDispatched)}},
			want:   map[string]cond{"Ready": {"False", ReasonPending}, "Reconciling": {"True", ReasonPending}},
		},
		"suspended after dispatch runs on": {
			spec:   bashtaskv1alpha1.BashTaskSpec{Suspend: ptr.To(true)},
			status: bashtaskv1alpha1.BashTaskStatus{NodeName: ptr.To("n"), Phase: ptr.To(bashtaskv1alpha1.PhaseRunning)},
			want:   map[string]cond{"Ready": {"False", ReasonRunning}, "Reconciling": {"True", ReasonRunning}},
		},
		"succeeded after running": {
			status: bashtaskv1alpha1.BashTaskStatus{Reason: ptr.To(bashtaskv1alpha1.ReasonSucceeded), Conditions: []metav1.Condition{
				{Type: bashtaskv1alpha1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: ReasonRunning},
				{Type: bashtaskv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonRunning},
			}},
			want: map[string]cond{"Ready": {"True", "Succeeded"}},
		},
		"failed after running": {
			status: bashtaskv1alpha1.BashTaskStatus{Reason: ptr.To(bashtaskv1alpha1.ReasonAgentLost), Message: ptr.To("gone"), Conditions: []metav1.Condition{
				{Type: bashtaskv1alpha1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: ReasonRunning},
			}},
			want: map[string]cond{"Ready": {"False", "AgentLost"}, "Stalled": {"True", "AgentLost"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: tc.spec, Status: tc.status}
			setReadiness(bt)
			got := map[string]cond{}
			for _, c := range bt.Status.Conditions {
				switch c.Type {
				case bashtaskv1alpha1.ConditionReady, bashtaskv1alpha1.ConditionReconciling, bashtaskv1alpha1.ConditionStalled:
					got[c.Type] = cond{string(c.Status), c.Reason}
					if c.ObservedGeneration != 3 || c.Message == "" {
						t.Errorf("%s: observedGeneration %d, message %q", c.Type, c.ObservedGeneration, c.Message)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(cond{})); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestApplyUploadsCarriesTheLastError: a pending upload's condition names
// the agent's last error, bounded in length (C42).
func TestApplyUploadsCarriesTheLastError(t *testing.T) {
	long := "blob (key \"ns/x/uid/stdout\") (code=Unknown): " + strings.Repeat("response body ", 1000)
	bt := &bashtaskv1alpha1.BashTask{Status: bashtaskv1alpha1.BashTaskStatus{Stdout: &bashtaskv1alpha1.StreamStatus{}}}
	applyUploads(bt, &agentv1.TaskStatus{Stdout: &agentv1.StreamStatus{Spill: &agentv1.Spill{
		UploadState: agentv1.UploadState_UPLOAD_STATE_PENDING, UploadAttempts: 3, UploadError: long,
	}}})
	c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionOutputUploaded)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonUploadPending {
		t.Fatalf("OutputUploaded = %+v, want False/UploadPending", c)
	}
	if want := "stdout (attempt 3 failed: blob (key \"ns/x/uid/stdout\") (code=Unknown): response body"; !strings.Contains(c.Message, want) {
		t.Errorf("message %q does not contain %q", c.Message, want)
	}
	if n := utf8.RuneCountInString(c.Message); n > maxUploadError+200 {
		t.Errorf("message is %d characters, want the error cut to %d", n, maxUploadError)
	}
}

func TestMarkOutputLost(t *testing.T) {
	type stream = bashtaskv1alpha1.StreamStatus
	parts := func(kept int64) *bashtaskv1alpha1.StreamParts {
		return &bashtaskv1alpha1.StreamParts{KeptBytes: ptr.To(kept)}
	}
	tests := map[string]struct {
		stdout, stderr *stream
		wantStdout     *bashtaskv1alpha1.StreamParts
		wantStderr     *bashtaskv1alpha1.StreamParts
		wantMessage    string
	}{
		"parts kept": {
			stdout:      &stream{Tail: ptr.To("xyz"), TotalBytes: ptr.To(int64(300000)), Truncated: ptr.To(true), Parts: parts(262144)},
			wantStdout:  &bashtaskv1alpha1.StreamParts{KeptBytes: ptr.To(int64(262144)), LostFromOffset: ptr.To(int64(262144))},
			wantMessage: "; output: stdout: the first 262144 bytes kept in object storage, every byte from offset 262144 on lost (at least 37856 bytes)",
		},
		"truncated without parts: all lost": {
			stderr:      &stream{Tail: ptr.To("abc"), TotalBytes: ptr.To(int64(100000)), Truncated: ptr.To(true)},
			wantStderr:  &bashtaskv1alpha1.StreamParts{LostFromOffset: ptr.To(int64(0))},
			wantMessage: "; output: stderr: no byte kept in object storage, every byte from offset 0 on lost (at least 100000 bytes)",
		},
		"whole tail and empty stream: nothing said": {
			stdout: &stream{Tail: ptr.To("before\n"), TotalBytes: ptr.To(int64(7))},
			stderr: &stream{TotalBytes: ptr.To(int64(0))},
		},
		"sanitized tail is not the stream": {
			stdout:      &stream{Tail: ptr.To("\ufffd"), TotalBytes: ptr.To(int64(3)), Sanitized: ptr.To(true)},
			wantStdout:  &bashtaskv1alpha1.StreamParts{LostFromOffset: ptr.To(int64(0))},
			wantMessage: "; output: stdout: no byte kept in object storage, every byte from offset 0 on lost (at least 3 bytes)",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := &bashtaskv1alpha1.BashTaskStatus{Stdout: tc.stdout, Stderr: tc.stderr}
			msg := markOutputLost(st)
			if msg != tc.wantMessage {
				t.Errorf("message %q, want %q", msg, tc.wantMessage)
			}
			for _, s := range []struct {
				got  *stream
				want *bashtaskv1alpha1.StreamParts
			}{{st.Stdout, tc.wantStdout}, {st.Stderr, tc.wantStderr}} {
				if s.got == nil {
					continue
				}
				if diff := cmp.Diff(s.want, s.got.Parts); diff != "" {
					t.Errorf("parts (-want +got):\n%s", diff)
				}
			}
		})
	}
}
