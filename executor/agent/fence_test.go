package agent

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

func fence(holder string, epoch int64) *agentv1.Fence {
	return &agentv1.Fence{Holder: holder, Epoch: epoch}
}

// wantFenced checks that err refuses the request as from an earlier leader
// and that its message names each of the epochs.
func wantFenced(t *testing.T, err error, epochs ...int64) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
	msg := status.Convert(err).Message()
	for _, e := range epochs {
		if !strings.Contains(msg, fmt.Sprintf("epoch %d", e)) {
			t.Errorf("message %q does not name epoch %d", msg, e)
		}
	}
}

func TestFenceRefusesEarlierLeaders(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	// Before any fenced request, an unfenced one is accepted (a controller
	// without leader election).
	if _, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("u0", "true")}); err != nil {
		t.Fatalf("unfenced Start before any fence: %v", err)
	}
	if _, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("u1", "sleep 30"), Fence: fence("ctrl-a", 2)}); err != nil {
		t.Fatalf("Start at epoch 2: %v", err)
	}

	_, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: "u1", Fence: fence("ctrl-b", 1)})
	wantFenced(t, err, 1, 2)
	// The newest fence is the refusal's detail, for a controller that
	// must raise its epoch above it.
	if d := status.Convert(err).Details(); len(d) != 1 {
		t.Errorf("refusal details %v, want the newest fence", d)
	} else if m, ok := d[0].(proto.Message); !ok || !proto.Equal(m, fence("ctrl-a", 2)) {
		t.Errorf("refusal detail %v, want ctrl-a at epoch 2", d[0])
	}
	_, err = r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("u2", "true"), Fence: fence("ctrl-b", 1)})
	wantFenced(t, err, 1, 2)
	_, err = r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("u2", "true")})
	wantFenced(t, err, 2)
	_, err = r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("u2", "true"), Fence: fence("ctrl-b", 2)})
	wantFenced(t, err, 2)
	if _, err := r.client.Get(ctx, &agentv1.GetRequest{Uid: "u2"}); status.Code(err) != codes.NotFound {
		t.Errorf("a refused Start created the task: Get says %v", err)
	}
	stream, err := r.client.Watch(ctx, &agentv1.WatchRequest{Fence: fence("ctrl-b", 1)})
	if err == nil {
		_, err = stream.Recv()
	}
	wantFenced(t, err, 1, 2)

	// A newer leader's Watch moves the fence: the leader of epoch 2 is now
	// refused too.
	info, _ := r.watchFenced(fence("ctrl-c", 3))
	if !proto.Equal(info.GetFence(), fence("ctrl-c", 3)) {
		t.Errorf("agent info fence %v, want ctrl-c at 3", info.GetFence())
	}
	_, err = r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: "u1", Fence: fence("ctrl-a", 2)})
	wantFenced(t, err, 2, 3)
	if _, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: "u1", Fence: fence("ctrl-c", 3)}); err != nil {
		t.Errorf("Cancel from the newest leader: %v", err)
	}

	for rpc, want := range map[string]float64{"Start": 3, "Cancel": 2, "Watch": 1} {
		if got := metricValue(t, r.srv.metrics.FencedRequests.WithLabelValues(rpc)); got != want {
			t.Errorf("fenced %s requests: %v, want %v", rpc, got, want)
		}
	}
	if got := metricValue(t, r.srv.metrics.LeaderEpoch); got != 3 {
		t.Errorf("leader epoch gauge %v, want 3", got)
	}
}

// watchFenced opens a Watch stream carrying f and returns the agent info.
func (r *rig) watchFenced(f *agentv1.Fence) (*agentv1.AgentInfo, agentv1.Executor_WatchClient) {
	r.t.Helper()
	stream, err := r.client.Watch(r.t.Context(), &agentv1.WatchRequest{Fence: f})
	if err != nil {
		r.t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		r.t.Fatalf("Watch at epoch %d: %v", f.GetEpoch(), err)
	}
	return first.GetAgent(), stream
}

func TestFenceSurvivesRestart(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	first := newRig(t, func(c *Config) { c.StateDir = stateDir })
	first.watchFenced(fence("ctrl-b", 5))
	if err := first.shutdown(); err != nil {
		t.Fatal(err)
	}

	r := newRig(t, func(c *Config) { c.StateDir = stateDir })
	_, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("late", "true"), Fence: fence("ctrl-a", 4)})
	wantFenced(t, err, 4, 5)
	info, _ := r.watchFenced(fence("ctrl-b", 5))
	if info.GetFence().GetEpoch() != 5 {
		t.Errorf("the restarted agent reports fence %v, want epoch 5", info.GetFence())
	}
	if got := metricValue(t, r.srv.metrics.LeaderEpoch); got != 5 {
		t.Errorf("leader epoch gauge after restart %v, want 5", got)
	}
}

// TestListPages lists an agent holding tasks with full 64000-byte tails on
// both streams: no page exceeds MaxListPageBytes (but a page of one task),
// and the pages together hold every task once, in UID order.
func TestListPages(t *testing.T) {
	r := newRig(t)
	const tasks = 40
	_, next := r.watch()
	cmd := "head -c 64000 /dev/zero | tr '\\0' o; head -c 64000 /dev/zero | tr '\\0' e >&2"
	for i := range tasks {
		if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec(fmt.Sprintf("t%03d", i), cmd)}); err != nil {
			t.Fatal(err)
		}
	}
	for range tasks {
		until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	}
	for _, size := range []int32{0, 7, 1000} {
		var seen []string
		token, pages := "", 0
		for {
			resp, err := r.client.List(t.Context(), &agentv1.ListRequest{PageSize: size, PageToken: token})
			if err != nil {
				t.Fatalf("page %d of size %d: %v", pages, size, err)
			}
			pages++
			if n := proto.Size(resp); n > MaxListPageBytes+4096 && len(resp.GetTasks()) > 1 {
				t.Errorf("a page of %d tasks is %d bytes, over %d", len(resp.GetTasks()), n, MaxListPageBytes)
			}
			if size > 0 && len(resp.GetTasks()) > int(size) {
				t.Errorf("a page of %d tasks for page_size %d", len(resp.GetTasks()), size)
			}
			for _, st := range resp.GetTasks() {
				if st.GetStdout().GetTotalBytes() != 64000 || len(st.GetStderr().GetTail()) != 64000 {
					t.Fatalf("task %s: stdout %d bytes, stderr tail %d bytes; the tails are not full", st.GetRef().GetUid(), st.GetStdout().GetTotalBytes(), len(st.GetStderr().GetTail()))
				}
				seen = append(seen, st.GetRef().GetUid())
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		var want []string
		for i := range tasks {
			want = append(want, fmt.Sprintf("t%03d", i))
		}
		if strings.Join(seen, ",") != strings.Join(want, ",") {
			t.Errorf("page size %d: listed %v, want every task once in order", size, seen)
		}
		if pages < 2 {
			t.Errorf("page size %d: %d page for %d tasks of 128 KB each", size, pages, tasks)
		}
	}
}
