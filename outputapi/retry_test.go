package outputapi

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// lateAgents is an agent that does not know the task for its first
// unknown calls, as when a request reaches it before the controller's
// Start does, then serves data.
type lateAgents struct {
	fakeAgents
	unknown atomic.Int64
}

func (f *lateAgents) Client(context.Context, string) (agentv1.ExecutorClient, error) { return f, nil }

func (f *lateAgents) ReadOutput(ctx context.Context, in *agentv1.ReadOutputRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.OutputChunk], error) {
	if f.unknown.Add(-1) >= 0 {
		return nil, status.Errorf(codes.NotFound, "task %s is unknown to this agent", in.GetUid())
	}
	return f.fakeAgents.ReadOutput(ctx, in, opts...)
}

// TestFollowAsksAgainSoonAfterNotFound: a follow whose agent does not
// know the task yet (its Start is on the way) asks again within
// milliseconds, not after agentRetryInterval: the first byte of a command
// that starts at once comes well under that.
func TestFollowAsksAgainSoonAfterNotFound(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := &taskStore{}
	task := store.set(dispatchedCopy(pendingTask(), "node-a"))
	infs := &fakeInformers{inf: &fakeInformer{}}
	agents := &lateAgents{fakeAgents: fakeAgents{data: []byte("hello\n")}}
	agents.unknown.Store(2)
	s := newTestServer(store, infs, agents)
	defer s.dispatch.stop()
	w := &firstByteWriter{header: http.Header{}, first: make(chan time.Time, 1)}
	lr := &logResponse{w: w, rc: http.NewResponseController(w)}
	o := outputv1alpha1.LogOptions{Stream: outputv1alpha1.StreamStdout, Follow: true}
	start := time.Now()
	if err := s.streamLog(context.Background(), lr, task, agentv1.OutputStream_OUTPUT_STREAM_STDOUT, o); err != nil {
		t.Fatalf("streamLog: %v", err)
	}
	select {
	case at := <-w.first:
		if d := at.Sub(start); d > agentRetryInterval/2 {
			t.Errorf("the first byte came %v after the request, two NOT_FOUND answers later; want well under %v", d, agentRetryInterval)
		} else {
			t.Logf("the first byte came %v after the request, two NOT_FOUND answers later", d)
		}
	default:
		t.Fatal("no byte was written")
	}
	if got := string(w.body); got != "hello\n" {
		t.Errorf("body %q, want %q", got, "hello\n")
	}
	checkNoWaiters(t, s)
}
