//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// workspaceClient is a Workspaces client of r with the controller's
// certificate.
func (r *rig) workspaceClient() agentv1.WorkspacesClient {
	r.t.Helper()
	return agentv1.NewWorkspacesClient(r.dial(r.ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}))
}

// ensure makes workspace uid with network and carry settings.
func ensure(t *testing.T, wc agentv1.WorkspacesClient, uid, network string, carryEnv bool) *agentv1.WorkspaceStatus {
	t.Helper()
	resp, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref:     &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + uid, Uid: uid},
		Network: network, CarryWorkingDir: true, CarryEnv: carryEnv,
	}})
	if err != nil {
		t.Fatalf("EnsureWorkspace %s: %v", uid, err)
	}
	return resp.GetStatus()
}

// wsTask is the spec of task uid in workspace ws.
func wsTask(uid, ws, command string) *agentv1.TaskSpec {
	spec := taskSpec(uid, command)
	spec.Workspace = &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + ws, Uid: ws}
	return spec
}

// runTask starts spec and waits for its end.
func (r *rig) runTask(spec *agentv1.TaskSpec) *agentv1.TaskStatus {
	r.t.Helper()
	if _, err := r.client.Start(r.t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		r.t.Fatalf("Start %s: %v", spec.GetRef().GetUid(), err)
	}
	return r.finished(spec.GetRef().GetUid())
}

// finished waits for task uid's end.
func (r *rig) finished(uid string) *agentv1.TaskStatus {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := r.client.Get(r.t.Context(), &agentv1.GetRequest{Uid: uid})
		if err != nil {
			r.t.Fatal(err)
		}
		if st := resp.GetStatus(); st.GetState() == agentv1.TaskState_TASK_STATE_FINISHED {
			return st
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("task %s did not finish", uid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The Workspaces service at the tenant level: a workspace is made once
// (Ensure is idempotent, its immutable fields are checked), its tasks run
// as its UID with HOME at its root and share its files, the next task
// starts where the last one ended, Get and List report it, and Delete
// removes it and releases its UID.
func TestWorkspaceLifecycle(t *testing.T) {
	r := newRig(t, tenantLevel(2101100, 2101109))
	wc := r.workspaceClient()
	info, _ := r.watch()
	if caps := info.GetReadiness().GetCapabilities(); !strings.Contains(strings.Join(caps, ","), "workspaces") {
		t.Errorf("capabilities %v lack workspaces", caps)
	}
	st := ensure(t, wc, "w1", "None", false)
	if st.GetRunAsUser() < 2101100 || st.GetPath() != executor.WorkspaceHome || st.GetWorkingDir() != executor.WorkspaceHome || st.GetNetwork() != "None" {
		t.Fatalf("status %v", st)
	}
	again := ensure(t, wc, "w1", "None", false)
	if again.GetRunAsUser() != st.GetRunAsUser() {
		t.Errorf("Ensure again: UID %d, first %d", again.GetRunAsUser(), st.GetRunAsUser())
	}
	if _, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-w1", Uid: "w1"}, Network: "Egress"}}); status.Code(err) != codes.FailedPrecondition && status.Code(err) != codes.InvalidArgument {
		t.Errorf("Ensure with another network: %v, want FAILED_PRECONDITION", err)
	}

	res := r.runTask(wsTask("t1", "w1", `id -u; echo "$HOME"; echo hi > a.txt; mkdir sub; cd sub`))
	if res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != itoa(int(st.GetRunAsUser()))+"\n"+executor.WorkspaceHome+"\n" {
		t.Fatalf("t1: %s %q stdout %q stderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
	if res.GetWorkingDir() != executor.WorkspaceHome {
		t.Errorf("t1 working_dir %q", res.GetWorkingDir())
	}
	g, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if gs := g.GetStatus(); gs.GetWorkingDir() != executor.WorkspaceHome+"/sub" || gs.GetLastTaskEnd() == nil || gs.GetRunningTasks() != 0 {
		t.Errorf("after t1: %v", gs)
	}
	res = r.runTask(wsTask("t2", "w1", `pwd; cat ../a.txt`))
	if res.GetStdout().GetTail() != executor.WorkspaceHome+"/sub\nhi\n" || res.GetWorkingDir() != executor.WorkspaceHome+"/sub" {
		t.Errorf("t2: %s %q stdout %q stderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
	if res := r.runTask(wsTask("t3", "nope", `true`)); res.GetReason() != "StartFailed" || !strings.Contains(res.GetMessage(), "nope") {
		t.Errorf("a task of an unknown workspace: %s %q", res.GetReason(), res.GetMessage())
	}
	l, err := wc.ListWorkspaces(t.Context(), &agentv1.ListWorkspacesRequest{})
	if err != nil || len(l.GetWorkspaces()) != 1 {
		t.Fatalf("List: %v %v", l, err)
	}

	root := filepath.Join(r.dir, WorkspaceDirPrefix+"w1")
	if _, err := os.Stat(filepath.Join(root, "a.txt")); err != nil {
		t.Errorf("the workspace's file on the node: %v", err)
	}
	if _, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "w1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("workspace root after delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "state", "workspaces", "w1")); !os.IsNotExist(err) {
		t.Errorf("workspace state after delete: %v", err)
	}
	if _, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "w1"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get after delete: %v", err)
	}
	r.srv.mu.Lock()
	_, held := r.srv.leases.held[st.GetRunAsUser()]
	r.srv.mu.Unlock()
	if held {
		t.Errorf("UID %d still leased after delete", st.GetRunAsUser())
	}
	if _, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "w1"}); err != nil {
		t.Errorf("Delete again: %v", err)
	}
}
