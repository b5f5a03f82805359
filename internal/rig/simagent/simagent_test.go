package simagent_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/simagent"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// TestTaskLifecycleOverMTLS: a controller's client (the local cluster's
// certificate) watches, starts a short and a `sleep` task, sees the agent's
// info, STARTED and FINISHED Succeeded in that order (the short one
// first), forgets them, and finds a workspace it ensured in the list.
func TestTaskLifecycleOverMTLS(t *testing.T) {
	certs, err := localcluster.IssueCerts(t.TempDir(), localcluster.AgentServerName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	port, err := localcluster.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	started := make(chan string, 4)
	a, err := simagent.Start(simagent.Options{Node: "node-1", Listen: addr, TLS: certs.Agent,
		ClientIdentity: localcluster.ControllerIdentity, OnStart: func(n string) { started <- n }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	tlsCfg, err := tlsutil.ClientConfig(certs.Controller, localcluster.AgentServerName)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ex, ws := agentv1.NewExecutorClient(conn), agentv1.NewWorkspacesClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	w, err := ex.Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if info := first.GetAgent(); info.GetNodeName() != "node-1" || !info.GetReadiness().GetReady() {
		t.Fatalf("first message %v, want node-1's ready info", first)
	}
	for _, c := range []struct{ uid, cmd string }{{"long", "sleep 0.3"}, {"short", "true"}} {
		if _, err := ex.Start(ctx, &agentv1.StartRequest{Spec: &agentv1.TaskSpec{
			Ref: &agentv1.TaskRef{Namespace: "ns", Name: c.uid, Uid: c.uid}, Command: c.cmd}}); err != nil {
			t.Fatalf("Start %s: %v", c.uid, err)
		}
	}
	var got []string
	for len(got) < 4 {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		e := m.GetTask()
		got = append(got, e.GetType().String()+" "+e.GetStatus().GetRef().GetUid()+" "+e.GetStatus().GetReason())
	}
	want := []string{"EVENT_TYPE_STARTED long ", "EVENT_TYPE_STARTED short ", "EVENT_TYPE_FINISHED short Succeeded", "EVENT_TYPE_FINISHED long Succeeded"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %q, want %q", got, want)
		}
	}
	if len(started) != 2 || a.Starts() != 2 {
		t.Fatalf("OnStart called %d times, Starts %d; want 2", len(started), a.Starts())
	}
	for _, uid := range []string{"long", "short"} {
		if r, err := ex.Forget(ctx, &agentv1.ForgetRequest{Uid: uid}); err != nil || !r.GetForgotten() {
			t.Fatalf("Forget %s: %v, %v", uid, r, err)
		}
	}
	if l, err := ex.List(ctx, &agentv1.ListRequest{}); err != nil || len(l.GetTasks()) != 0 {
		t.Fatalf("List after Forget: %v, %v; want none", l, err)
	}
	if _, err := ws.EnsureWorkspace(ctx, &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "w", Uid: "w1", Epoch: 1}}}); err != nil {
		t.Fatal(err)
	}
	if l, err := ws.ListWorkspaces(ctx, &agentv1.ListWorkspacesRequest{}); err != nil || len(l.GetWorkspaces()) != 1 {
		t.Fatalf("ListWorkspaces: %v, %v; want w1", l, err)
	}
}
