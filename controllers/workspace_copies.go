package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ReasonStaleCopyRemoved is the event reason on a BashWorkspace when an
// agent's copy of it that is not the current one (an agent back after the
// workspace moved on, or a copy whose release was cut short) was removed.
const ReasonStaleCopyRemoved = "StaleCopyRemoved"

// WorkspaceCopies is what the stale-copy sweep needs from the agents.
// AgentRegistry implements it.
type WorkspaceCopies interface {
	// Agents returns the state of every known agent.
	Agents() []agentpool.AgentState
	// ListWorkspaces returns the workspaces a connected agent holds.
	ListWorkspaces(ctx context.Context, node string) ([]*agentv1.WorkspaceStatus, error)
	// DeleteWorkspace stops a workspace's tasks and removes it;
	// idempotent.
	DeleteWorkspace(ctx context.Context, node, uid string) (int32, error)
}

// staleCopy says why an agent's copy of a workspace is not the current
// one, from the object as the API server has it now (nil when it is
// gone), or "" when it is current.
func staleCopy(node string, cp *agentv1.WorkspaceStatus, ws *bashtaskv1alpha1.BashWorkspace) string {
	ref := cp.GetRef()
	switch {
	case ws == nil:
		return fmt.Sprintf("BashWorkspace %s/%s no longer exists", ref.GetNamespace(), ref.GetName())
	case string(ws.UID) != ref.GetUid():
		return fmt.Sprintf("BashWorkspace %s/%s was made again (uid %s, the copy's %s)", ws.Namespace, ws.Name, ws.UID, ref.GetUid())
	case ptr.Deref(ws.Status.NodeName, "") != node:
		where := "no node (Suspended)"
		if n := ptr.Deref(ws.Status.NodeName, ""); n != "" {
			where = "node " + n
		}
		return fmt.Sprintf("the workspace is at epoch %d on %s; this copy is of epoch %d", ptr.Deref(ws.Status.Epoch, 0), where, ref.GetEpoch())
	case ref.GetEpoch() != 0 && ptr.Deref(ws.Status.Epoch, 0) != 0 && ref.GetEpoch() != *ws.Status.Epoch:
		return fmt.Sprintf("the workspace is at epoch %d; this copy is of epoch %d", *ws.Status.Epoch, ref.GetEpoch())
	}
	return ""
}

// sweepWorkspaces removes every copy a connected agent holds that is not
// its workspace's current one, judged from a live read (never the cache,
// which may not have the write-ahead of a placement yet), and reports it
// on the workspace when the object exists. A copy's tasks have been
// refused since its workspace's epoch moved on (the agent checks the
// epoch of each task); removing it frees its UID and disk.
func (c *OrphanCollector) sweepWorkspaces(ctx context.Context) {
	wc := c.opts.Workspaces
	if wc == nil {
		return
	}
	for _, a := range wc.Agents() {
		if !a.Connected || !slices.Contains(a.Capabilities, "workspaces") {
			continue
		}
		copies, err := wc.ListWorkspaces(ctx, a.Node)
		if err != nil {
			c.opts.Log.V(1).Info("Listing an agent's workspaces", "node", a.Node, "err", err)
			continue
		}
		for _, cp := range copies {
			ref := cp.GetRef()
			var ws *bashtaskv1alpha1.BashWorkspace
			got := &bashtaskv1alpha1.BashWorkspace{}
			err := c.opts.APIReader.Get(ctx, types.NamespacedName{Namespace: ref.GetNamespace(), Name: ref.GetName()}, got)
			switch {
			case err == nil:
				ws = got
			case !apierrors.IsNotFound(err):
				c.opts.Log.Error(err, "Reading a workspace for the stale-copy check", "node", a.Node, "workspace", ref.GetUid())
				continue
			}
			if ws != nil && !ws.DeletionTimestamp.IsZero() {
				continue // its own deletion removes it
			}
			why := staleCopy(a.Node, cp, ws)
			if why == "" {
				continue
			}
			if _, err := wc.DeleteWorkspace(ctx, a.Node, ref.GetUid()); err != nil {
				c.opts.Log.Error(err, "Removing a stale workspace copy", "node", a.Node, "workspace", ref.GetUid(), "why", why)
				continue
			}
			c.opts.Log.Info("Removed a stale workspace copy", "node", a.Node, "namespace", ref.GetNamespace(), "name", ref.GetName(),
				"workspace", ref.GetUid(), "epoch", ref.GetEpoch(), "why", why)
			if ws != nil && string(ws.UID) == ref.GetUid() && c.opts.Recorder != nil {
				c.opts.Recorder.Eventf(ws, nil, corev1.EventTypeNormal, ReasonStaleCopyRemoved, "Sweep",
					"Removed the copy of epoch %d on node %s: %s", ref.GetEpoch(), a.Node, why)
			}
		}
	}
}
