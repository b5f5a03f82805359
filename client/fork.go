package client

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// MaxForkCount is the most forks one Fork call makes (ForkOptions.Count).
const MaxForkCount = 64

// ForkOptions describe the copies Fork makes of one workspace
// (docs/workspaces.md, "Forking a workspace").
type ForkOptions struct {
	// Namespace of the source; empty means "default". Source is the
	// source workspace's name, required.
	Namespace, Source string
	// Count is how many copies to make, 1 to MaxForkCount; 0 means 1.
	Count int
	// NamePrefix is the copies' metadata.generateName, the API server
	// appending 5 random characters; empty means Source + "-fork-".
	NamePrefix string
	// NodeName places the copies on this node (spec.nodeName); empty:
	// the source's node, where the copy is local.
	NodeName string
	// NoWait returns the copies as created, without waiting for them to
	// be Ready.
	NoWait bool
}

// Fork makes opts.Count copies of a workspace, each a BashWorkspace with
// spec.source naming it, and by default waits until every copy is Ready
// (ctx bounds the wait). A copy gets the source's files and carried
// state as of one instant, its own UID, network and quota; the source
// keeps running. Each copy takes the source's spec.owner (the owner
// rule: only the source's owner forks it), carry-over, network, idle
// timeout and action, and image pull secrets. It returns the copies in
// the order made: when a wait fails, the error (a *WorkspaceFailedError
// for a copy that Failed, the message saying why) together with every
// copy made, so that the caller may delete them. RBAC: get on the
// source, create, get, list and watch on bashworkspaces.
func (c *Client) Fork(ctx context.Context, opts ForkOptions) ([]*bashtaskv1alpha1.BashWorkspace, error) {
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	n := max(opts.Count, 1)
	if opts.Count < 0 || n > MaxForkCount {
		return nil, fmt.Errorf("ForkOptions.Count %d: 1 to %d copies", opts.Count, MaxForkCount)
	}
	src, err := c.GetWorkspace(ctx, opts.Namespace, opts.Source)
	if err != nil {
		return nil, err
	}
	forks := make([]*bashtaskv1alpha1.BashWorkspace, 0, n)
	for range n {
		ws := forkOf(src, opts)
		if err := c.k8s.Create(ctx, ws); err != nil {
			return forks, fmt.Errorf("creating a fork of workspace %s/%s: %w", src.Namespace, src.Name, err)
		}
		forks = append(forks, ws)
	}
	if opts.NoWait {
		return forks, nil
	}
	return c.waitForks(ctx, forks)
}

// forkOf is the BashWorkspace of one copy of src.
func forkOf(src *bashtaskv1alpha1.BashWorkspace, opts ForkOptions) *bashtaskv1alpha1.BashWorkspace {
	prefix := opts.NamePrefix
	if prefix == "" {
		prefix = src.Name + "-fork-"
	}
	s := src.Spec
	return &bashtaskv1alpha1.BashWorkspace{
		ObjectMeta: metav1.ObjectMeta{Namespace: src.Namespace, GenerateName: prefix},
		Spec: bashtaskv1alpha1.BashWorkspaceSpec{
			Owner: s.Owner, NodeName: optional(opts.NodeName), Network: s.Network,
			CarryOver: s.CarryOver, IdleTimeoutSeconds: s.IdleTimeoutSeconds, IdleAction: s.IdleAction,
			ImagePullSecrets: s.ImagePullSecrets,
			Source:           &bashtaskv1alpha1.WorkspaceSource{Workspace: src.Name},
		},
	}
}

// waitForks waits for every fork to be Ready, at once, and returns them
// as they are then; on a failure, the forks as created and the errors.
func (c *Client) waitForks(ctx context.Context, forks []*bashtaskv1alpha1.BashWorkspace) ([]*bashtaskv1alpha1.BashWorkspace, error) {
	got := make([]*bashtaskv1alpha1.BashWorkspace, len(forks))
	errs := make([]error, len(forks))
	done := make(chan struct{}, len(forks))
	for i, ws := range forks {
		go func() {
			defer func() { done <- struct{}{} }()
			got[i], errs[i] = c.WaitWorkspace(ctx, ws.Namespace, ws.Name, func(w *bashtaskv1alpha1.BashWorkspace) bool {
				return ptr.Deref(w.Status.Phase, "") == bashtaskv1alpha1.WorkspaceReady
			})
		}()
	}
	for range forks {
		<-done
	}
	if err := errors.Join(errs...); err != nil {
		return forks, err
	}
	return got, nil
}
