package agentpool

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// ErrWorkspaceUnknown is returned by [AgentRegistry.GetWorkspace] when the
// agent does not hold the workspace's UID.
var ErrWorkspaceUnknown = errors.New("agent does not hold the workspace")

// EnsureWorkspace makes the workspace on the node's agent, or returns it as
// it is: the agent makes the call idempotent on the workspace's UID. The
// error keeps the agent's gRPC status (INVALID_ARGUMENT, FAILED_PRECONDITION,
// RESOURCE_EXHAUSTED) for status.Code.
func (r *AgentRegistry) EnsureWorkspace(ctx context.Context, node string, spec *agentv1.WorkspaceSpec) (*agentv1.EnsureWorkspaceResponse, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	ctx, cancel, fence, err := fenceFor(ctx, r.opts.Fence, "EnsureWorkspace")
	if err != nil {
		return nil, fmt.Errorf("ensuring workspace %s on node %q: %w", spec.GetRef().GetUid(), node, err)
	}
	defer cancel()
	resp, err := agentv1.NewWorkspacesClient(a.cc).EnsureWorkspace(ctx, &agentv1.EnsureWorkspaceRequest{Spec: spec, Fence: fence})
	noteFenced(r.opts.Fence, err)
	if err != nil {
		return nil, fmt.Errorf("ensuring workspace %s on node %q: %w", spec.GetRef().GetUid(), node, err)
	}
	return resp, nil
}

// GetWorkspace returns the workspace's state on the node's agent now, or an
// error wrapping ErrWorkspaceUnknown when the agent does not hold it.
func (r *AgentRegistry) GetWorkspace(ctx context.Context, node, uid string) (*agentv1.WorkspaceStatus, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	resp, err := agentv1.NewWorkspacesClient(a.cc).GetWorkspace(ctx, &agentv1.GetWorkspaceRequest{Uid: uid})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("workspace %s on node %q: %w", uid, node, ErrWorkspaceUnknown)
	}
	if err != nil {
		return nil, fmt.Errorf("getting workspace %s from node %q: %w", uid, node, err)
	}
	return resp.GetStatus(), nil
}

// DeleteWorkspace has the node's agent stop the workspace's running tasks
// and remove its directory, network and UID lease. It returns once all of
// it is gone, with the number of tasks it stopped; a workspace the agent
// does not hold is no error.
func (r *AgentRegistry) DeleteWorkspace(ctx context.Context, node, uid string) (int32, error) {
	a, err := r.conn(node)
	if err != nil {
		return 0, err
	}
	ctx, cancel, fence, err := fenceFor(ctx, r.opts.Fence, "DeleteWorkspace")
	if err != nil {
		return 0, fmt.Errorf("deleting workspace %s on node %q: %w", uid, node, err)
	}
	defer cancel()
	resp, err := agentv1.NewWorkspacesClient(a.cc).DeleteWorkspace(ctx, &agentv1.DeleteWorkspaceRequest{Uid: uid, Fence: fence})
	noteFenced(r.opts.Fence, err)
	if err != nil {
		return 0, fmt.Errorf("deleting workspace %s on node %q: %w", uid, node, err)
	}
	return resp.GetCancelledTasks(), nil
}

// SnapshotWorkspace has the node's agent snapshot the workspace to its
// bucket and returns the snapshot. The error keeps the agent's gRPC
// status (UNAVAILABLE when the bucket failed, NOT_FOUND when the agent
// does not hold the workspace).
func (r *AgentRegistry) SnapshotWorkspace(ctx context.Context, node, uid string) (*agentv1.WorkspaceSnapshot, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	ctx, cancel, fence, err := fenceFor(ctx, r.opts.Fence, "SnapshotWorkspace")
	if err != nil {
		return nil, fmt.Errorf("snapshot of workspace %s on node %q: %w", uid, node, err)
	}
	defer cancel()
	resp, err := agentv1.NewWorkspacesClient(a.cc).SnapshotWorkspace(ctx, &agentv1.SnapshotWorkspaceRequest{Uid: uid, Fence: fence})
	noteFenced(r.opts.Fence, err)
	if err != nil {
		return nil, fmt.Errorf("snapshot of workspace %s on node %q: %w", uid, node, err)
	}
	return resp.GetSnapshot(), nil
}

// FencedRefusal reports whether err is an agent's refusal of this
// controller's leader fence (FAILED_PRECONDITION carrying the newest
// Fence), which is no statement about the request itself.
func FencedRefusal(err error) bool {
	if status.Code(err) != codes.FailedPrecondition {
		return false
	}
	for _, d := range status.Convert(err).Details() {
		if _, ok := d.(*agentv1.Fence); ok {
			return true
		}
	}
	return false
}

// ListWorkspaces returns the workspaces the node's agent holds.
func (r *AgentRegistry) ListWorkspaces(ctx context.Context, node string) ([]*agentv1.WorkspaceStatus, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	resp, err := agentv1.NewWorkspacesClient(a.cc).ListWorkspaces(ctx, &agentv1.ListWorkspacesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing the workspaces of node %q: %w", node, err)
	}
	return resp.GetWorkspaces(), nil
}
