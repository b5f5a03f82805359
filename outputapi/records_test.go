package outputapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/taskrecord"
)

// errorResponder is a rest.Responder that keeps the error it is given.
type errorResponder struct{ err error }

func (r *errorResponder) Object(int, runtime.Object) {}
func (r *errorResponder) Error(err error)            { r.err = err }

// TestLogOfTaskDeletedDuringTheRequest: the cache still holds a finished
// task that kube-apiserver has deleted and its agent has forgotten. The
// request finds it in the cache, the agent answers NotFound and the read
// from kube-apiserver says it is gone; the output comes from the record
// the controller kept, as it would for a request a moment later.
func TestLogOfTaskDeletedDuringTheRequest(t *testing.T) {
	s := storedServer(t)
	out := []byte("seq output\n")
	task := storedTask()
	task.Status.NodeName = ptr.To("node-a")
	task.Status.Reason = ptr.To(bashtaskv1alpha1.ReasonSucceeded)
	task.Status.Stdout = &bashtaskv1alpha1.StreamStatus{TotalBytes: ptr.To(int64(len(out))), Tail: ptr.To("output\n"), Truncated: ptr.To(true),
		Spill: &bashtaskv1alpha1.SpillRef{URL: ptr.To(s.bucketBase + "/ns/t/u1/stdout"), Bytes: ptr.To(int64(len(out)))}}
	put(t, s, "ns/t/u1/stdout", out)
	if err := taskrecord.Write(t.Context(), s.bucket, task); err != nil {
		t.Fatal(err)
	}
	stale := &taskStore{}
	stale.set(task)
	agents := &lateAgents{}
	agents.unknown.Store(1 << 30)
	s.cfg = Config{Tasks: stale, LiveTasks: &taskStore{}, Agents: agents}

	rec := httptest.NewRecorder()
	resp := &errorResponder{}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	s.serveLog(rec, req, resp, "ns", "t", outputv1alpha1.LogOptions{Stream: outputv1alpha1.StreamStdout})
	if resp.err != nil {
		t.Fatalf("log of the task deleted during the request: %v", resp.err)
	}
	if got := rec.Body.String(); got != string(out) {
		t.Errorf("body %q, want %q", got, out)
	}
	if got := rec.Header().Get(outputv1alpha1.HeaderTaskUID); got != "u1" {
		t.Errorf("task UID header %q, want u1", got)
	}
}
