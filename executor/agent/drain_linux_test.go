//go:build linux

package agent

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// infoStream opens a Watch stream and returns a function that waits up
// to 20 s for the next AgentInfo that satisfies ok (the first message
// included) and one that reports whether the stream still runs.
func (r *rig) infoStream() (next func(ok func(*agentv1.AgentInfo) bool) *agentv1.AgentInfo, open func() bool) {
	r.t.Helper()
	ctx, cancel := context.WithCancel(r.t.Context())
	r.t.Cleanup(cancel)
	stream, err := r.client.Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		r.t.Fatal(err)
	}
	infos := make(chan *agentv1.AgentInfo, 1024)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if info := m.GetAgent(); info != nil {
				infos <- info
			}
		}
	}()
	next = func(ok func(*agentv1.AgentInfo) bool) *agentv1.AgentInfo {
		r.t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case info := <-infos:
				if ok(info) {
					return info
				}
			case <-deadline:
				r.t.Fatal("no such agent info within 20 s")
				return nil
			}
		}
	}
	open = func() bool {
		select {
		case <-ended:
			return false
		default:
			return true
		}
	}
	return next, open
}

// A draining agent says so on its Watch stream, which stays open, takes
// no new task or workspace, stops its running tasks, and waits until the
// controller has released every workspace that may move (not the pinned
// one), while it still serves the snapshot and the release.
func TestDrainWaitsForMovableWorkspaces(t *testing.T) {
	r := newRig(t, tenantLevel(2101400, 2101409), withBucket(t.TempDir()))
	wc := r.workspaceClient()
	ensure(t, wc, "m1", "None", false)
	if _, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-p1", Uid: "p1"}, Network: "None", Pinned: true,
	}}); err != nil {
		t.Fatal(err)
	}
	nextInfo, open := r.infoStream()
	if info := nextInfo(func(*agentv1.AgentInfo) bool { return true }); info.GetReadiness().GetDraining() || !info.GetReadiness().GetReady() {
		t.Fatalf("before the drain: readiness %v", info.GetReadiness())
	}
	// A task that outlives its SIGTERM by a second: the agent's own stop,
	// not the task, ends it.
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: wsTask("long", "m1", `trap '' TERM; echo kept > f; echo written; sleep 60`)}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "long"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetStatus().GetStdout().GetTail() == "written\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task did not write its file: %v", resp.GetStatus())
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	drained := make(chan DrainResult, 1)
	go func() { drained <- r.srv.Drain(ctx) }()
	info := nextInfo(func(i *agentv1.AgentInfo) bool { return i.GetReadiness().GetDraining() })
	if rd := info.GetReadiness(); rd.GetReady() || !strings.Contains(strings.Join(rd.GetProblems(), "; "), "shutting down: moving 1 workspaces to other nodes") ||
		!strings.Contains(strings.Join(rd.GetCapabilities(), ","), "snapshots") {
		t.Errorf("draining readiness %v: want not ready, the count of workspaces to move, and the snapshots capability", rd)
	}
	if ready, problems := r.srv.Readiness(); ready {
		t.Errorf("Readiness while draining: ready, problems %v", problems)
	}
	if h, err := r.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health while draining: %v %v, want NOT_SERVING", h, err)
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: wsTask("late", "m1", "true")}); status.Code(err) != codes.Unavailable {
		t.Errorf("Start while draining: %v, want UNAVAILABLE", err)
	}
	if _, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-n1", Uid: "n1"}, Network: "None",
	}}); status.Code(err) != codes.Unavailable {
		t.Errorf("a new workspace while draining: %v, want UNAVAILABLE", err)
	}
	ensure(t, wc, "m1", "None", false) // a known one still answers

	if st := r.finished("long"); st.GetReason() != ReasonAgentRestarted {
		t.Errorf("the running task: %s %q, want %s", st.GetReason(), st.GetMessage(), ReasonAgentRestarted)
	}
	select {
	case res := <-drained:
		t.Fatalf("Drain returned before the workspace was released: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}
	if snap, err := wc.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "m1"}); err != nil || snap.GetSnapshot().GetFiles() != 1 {
		t.Fatalf("snapshot while draining: %v %v, want the task's one file", snap, err)
	}
	if _, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "m1"}); err != nil {
		t.Fatalf("release while draining: %v", err)
	}
	select {
	case res := <-drained:
		if res.StoppedTasks != 1 || res.Movable != 1 || res.Left != 0 {
			t.Errorf("drain %+v: want 1 task stopped, 1 workspace movable, none left", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return within 10 s of the release")
	}
	nextInfo(func(i *agentv1.AgentInfo) bool {
		return i.GetReadiness().GetDraining() && slices.Contains(i.GetReadiness().GetProblems(), "shutting down")
	})
	if !open() {
		t.Error("the Watch stream ended during the drain")
	}
	if _, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "p1"}); err != nil {
		t.Errorf("the pinned workspace: %v, want it kept", err)
	}
}

// A drain that the controller does not finish ends at its context's
// deadline, or once no controller watched the agent for a while, with the
// workspace kept on the node; and an agent without a bucket the nodes
// share moves nothing, so it does not wait.
func TestDrainEnds(t *testing.T) {
	t.Run("at its deadline", func(t *testing.T) {
		r := newRig(t, tenantLevel(2101410, 2101419), withBucket(t.TempDir()))
		wc := r.workspaceClient()
		ensure(t, wc, "m2", "None", false)
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		began := time.Now()
		res := r.srv.Drain(ctx)
		if took := time.Since(began); res.Movable != 1 || res.Left != 1 || took < 500*time.Millisecond {
			t.Errorf("drain %+v after %v: want 1 workspace left at the 500 ms deadline", res, took)
		}
		if _, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "m2"}); err != nil {
			t.Errorf("the workspace after the drain: %v, want it kept", err)
		}
	})
	t.Run("without a controller", func(t *testing.T) {
		r := newRig(t, tenantLevel(2101430, 2101439), withBucket(t.TempDir()),
			func(c *Config) { c.DrainUnwatchedLimit = 300 * time.Millisecond })
		ensure(t, r.workspaceClient(), "m4", "None", false)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		began := time.Now()
		res := r.srv.Drain(ctx)
		if took := time.Since(began); !res.Unwatched || res.Left != 1 || took < 300*time.Millisecond || took > 10*time.Second {
			t.Errorf("drain %+v after %v: want it to end for want of a Watch stream after 300 ms, the workspace left", res, took)
		}
	})
	t.Run("without a shared bucket", func(t *testing.T) {
		r := newRig(t, tenantLevel(2101420, 2101429))
		ensure(t, r.workspaceClient(), "m3", "None", false)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		began := time.Now()
		if res := r.srv.Drain(ctx); res.Movable != 0 || res.Left != 0 || time.Since(began) > 5*time.Second {
			t.Errorf("drain %+v after %v: want nothing to move, at once", res, time.Since(began))
		}
	})
}
