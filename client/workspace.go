package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// WorkspaceOptions describe the BashWorkspace CreateWorkspace makes
// (docs/workspaces.md has each field). Every field is a plain value; the
// zero value of each is the API's default.
type WorkspaceOptions struct {
	// Namespace of the workspace; empty means "default". Name is
	// required.
	Namespace, Name string
	// Owner is spec.owner: only tasks of this owner run in it.
	Owner string
	// NodeName is spec.nodeName, NodeSelector spec.nodeSelector.
	NodeName     string
	NodeSelector map[string]string
	// Storage is spec.storage, a quantity such as "2Gi".
	Storage string
	// Network is spec.network: "Egress", "None" or "Node".
	Network string
	// CarryEnvironment carries the variables each task exports to the
	// next (spec.carryOver.environment); NoCarryWorkingDir starts every
	// task at the workspace's root (spec.carryOver.workingDir false).
	CarryEnvironment, NoCarryWorkingDir bool
	// IdleTimeout is spec.idleTimeoutSeconds (whole seconds, 1 s to 30
	// days), IdleAction spec.idleAction ("Suspend" or "Delete"; empty:
	// Suspend where the agents can snapshot, else Delete).
	IdleTimeout time.Duration
	IdleAction  string
	// Image is spec.image, the OCI image the workspace's tasks run in
	// (docs/images.md); empty: the agent's default image, or the node's
	// root. ImagePullSecrets are spec.imagePullSecrets, names of Secrets
	// of type kubernetes.io/dockerconfigjson in Namespace (at most 16).
	Image            string
	ImagePullSecrets []string
}

// WorkspaceFailedError is a wait for a workspace that ended in a final
// phase, Failed or NodeLost, or was deleted.
type WorkspaceFailedError struct {
	// Namespace and Name name the workspace; Phase and Message are its
	// status (Phase empty when it was deleted).
	Namespace, Name string
	Phase           bashtaskv1alpha1.WorkspacePhase
	Message         string
}

func (e *WorkspaceFailedError) Error() string {
	if e.Phase == "" {
		return fmt.Sprintf("workspace %s/%s was deleted", e.Namespace, e.Name)
	}
	return fmt.Sprintf("workspace %s/%s is %s: %s", e.Namespace, e.Name, e.Phase, e.Message)
}

// CreateWorkspace creates a BashWorkspace and returns it as created,
// without waiting (WaitWorkspaceReady waits). RBAC: create on
// bashworkspaces. An option out of the API's range is an error naming it.
func (c *Client) CreateWorkspace(ctx context.Context, opts WorkspaceOptions) (*bashtaskv1alpha1.BashWorkspace, error) {
	ws, err := workspaceOf(opts)
	if err != nil {
		return nil, err
	}
	if err := c.k8s.Create(ctx, ws); err != nil {
		return nil, fmt.Errorf("creating workspace %s/%s: %w", ws.Namespace, ws.Name, err)
	}
	return ws, nil
}

func workspaceOf(opts WorkspaceOptions) (*bashtaskv1alpha1.BashWorkspace, error) {
	ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: opts.Name}}
	if ws.Namespace == "" {
		ws.Namespace = "default"
	}
	s := &ws.Spec
	s.Owner, s.NodeName, s.NodeSelector = optional(opts.Owner), optional(opts.NodeName), opts.NodeSelector
	if opts.Storage != "" {
		q, err := resource.ParseQuantity(opts.Storage)
		if err != nil {
			return nil, fmt.Errorf("WorkspaceOptions.Storage %q (spec.storage): %w", opts.Storage, err)
		}
		s.Storage = &q
	}
	if opts.Network != "" {
		s.Network = ptr.To(bashtaskv1alpha1.TaskNetwork(opts.Network))
	}
	if opts.CarryEnvironment || opts.NoCarryWorkingDir {
		s.CarryOver = &bashtaskv1alpha1.CarryOver{WorkingDir: ptr.To(!opts.NoCarryWorkingDir), Environment: ptr.To(opts.CarryEnvironment)}
	}
	if opts.IdleTimeout != 0 {
		secs := opts.IdleTimeout / time.Second
		if opts.IdleTimeout%time.Second != 0 || secs < 1 || secs > bashtaskv1alpha1.MaxIdleTimeoutSeconds {
			return nil, fmt.Errorf("WorkspaceOptions.IdleTimeout %s: spec.idleTimeoutSeconds is whole seconds from 1 to %d", opts.IdleTimeout, bashtaskv1alpha1.MaxIdleTimeoutSeconds)
		}
		s.IdleTimeoutSeconds = ptr.To(int32(secs))
	}
	if opts.IdleAction != "" {
		s.IdleAction = ptr.To(bashtaskv1alpha1.WorkspaceIdleAction(opts.IdleAction))
	}
	var err error
	if s.Image, s.ImagePullSecrets, err = imageOf("WorkspaceOptions", opts.Image, opts.ImagePullSecrets); err != nil {
		return nil, err
	}
	return ws, nil
}

// GetWorkspace reads a BashWorkspace (RBAC: get on bashworkspaces).
func (c *Client) GetWorkspace(ctx context.Context, namespace, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	var ws bashtaskv1alpha1.BashWorkspace
	if err := c.k8s.Get(ctx, ctrlclient.ObjectKey{Namespace: namespace, Name: name}, &ws); err != nil {
		return nil, fmt.Errorf("reading workspace %s/%s: %w", namespace, name, err)
	}
	return &ws, nil
}

// WaitWorkspaceReady waits until the workspace is Ready and not being
// suspended, and returns it; a *WorkspaceFailedError when it is Failed,
// NodeLost or deleted first; ctx bounds the wait. RBAC: get, list and
// watch on bashworkspaces.
func (c *Client) WaitWorkspaceReady(ctx context.Context, namespace, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	return c.WaitWorkspace(ctx, namespace, name, func(ws *bashtaskv1alpha1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == bashtaskv1alpha1.WorkspaceReady && !ptr.Deref(ws.Spec.Suspend, false)
	})
}

// SuspendWorkspace sets spec.suspend: the workspace is snapshotted once
// its running tasks end, and its node's copy and UID are released
// (docs/workspaces.md). It waits until the workspace is Suspended and
// released, and returns it; RBAC: patch, get, list and watch on
// bashworkspaces.
func (c *Client) SuspendWorkspace(ctx context.Context, namespace, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	if err := c.patchSuspend(ctx, namespace, name, true); err != nil {
		return nil, err
	}
	return c.WaitWorkspace(ctx, namespace, name, func(ws *bashtaskv1alpha1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == bashtaskv1alpha1.WorkspaceSuspended && ws.Status.NodeName == nil
	})
}

// ResumeWorkspace clears spec.suspend: the workspace is restored from its
// snapshot on a node that fits its placement. It waits until it is Ready,
// as WaitWorkspaceReady, and returns it. While spec.suspend is true the
// workspace is held: a task naming it is refused (docs/workspaces.md).
func (c *Client) ResumeWorkspace(ctx context.Context, namespace, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	if err := c.patchSuspend(ctx, namespace, name, false); err != nil {
		return nil, err
	}
	return c.WaitWorkspaceReady(ctx, namespace, name)
}

func (c *Client) patchSuspend(ctx context.Context, namespace, name string, suspend bool) error {
	ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	patch := fmt.Sprintf(`{"spec":{"suspend":%t}}`, suspend)
	if err := c.k8s.Patch(ctx, ws, ctrlclient.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return fmt.Errorf("setting spec.suspend=%t of workspace %s/%s: %w", suspend, namespace, name, err)
	}
	return nil
}

// DeleteWorkspace deletes a workspace and waits until it is gone: its
// running tasks are cancelled, then its files, network and UID are
// removed (docs/workspaces.md). A workspace that does not exist is no
// error. RBAC: delete, get, list and watch on bashworkspaces.
func (c *Client) DeleteWorkspace(ctx context.Context, namespace, name string) error {
	ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := c.k8s.Delete(ctx, ws); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("deleting workspace %s/%s: %w", namespace, name, err)
	}
	_, err := c.WaitWorkspace(ctx, namespace, name, func(*bashtaskv1alpha1.BashWorkspace) bool { return false })
	var fe *WorkspaceFailedError
	if errors.As(err, &fe) && fe.Phase == "" {
		return nil
	}
	return err
}

// WaitWorkspace watches a workspace (a read, then one watch from its
// resourceVersion, field selector on its name) until done says so, and
// returns it then. A workspace that is Failed or NodeLost (and not being
// deleted), or that is deleted, ends the wait with a
// *WorkspaceFailedError; ctx bounds it.
func (c *Client) WaitWorkspace(ctx context.Context, namespace, name string, done func(*bashtaskv1alpha1.BashWorkspace) bool) (*bashtaskv1alpha1.BashWorkspace, error) {
	for {
		ws, err := c.GetWorkspace(ctx, namespace, name)
		if apierrors.IsNotFound(err) {
			return nil, &WorkspaceFailedError{Namespace: namespace, Name: name}
		}
		if err != nil {
			return nil, err
		}
		wi, err := c.k8s.Watch(ctx, &bashtaskv1alpha1.BashWorkspaceList{}, &ctrlclient.ListOptions{
			Namespace:     namespace,
			FieldSelector: fields.OneTermEqualSelector("metadata.name", name),
			Raw:           &metav1.ListOptions{ResourceVersion: ws.ResourceVersion},
		})
		if err != nil {
			return nil, fmt.Errorf("watching workspace %s/%s: %w", namespace, name, err)
		}
		got, err := drainWorkspace(ctx, wi, ws, done)
		wi.Stop()
		if got != nil || err != nil {
			return got, err
		}
		// The watch ended (or expired): read again, after a pause so that
		// a server closing watches at once is not asked in a loop.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// drainWorkspace feeds ws, then each state the watch delivers, to done;
// it returns nil, nil when the watch ended first.
func drainWorkspace(ctx context.Context, wi watch.Interface, ws *bashtaskv1alpha1.BashWorkspace, done func(*bashtaskv1alpha1.BashWorkspace) bool) (*bashtaskv1alpha1.BashWorkspace, error) {
	for {
		if done(ws) {
			return ws, nil
		}
		switch phase := ptr.Deref(ws.Status.Phase, ""); phase {
		case bashtaskv1alpha1.WorkspaceFailed, bashtaskv1alpha1.WorkspaceNodeLost:
			if ws.DeletionTimestamp.IsZero() {
				return nil, &WorkspaceFailedError{Namespace: ws.Namespace, Name: ws.Name, Phase: phase, Message: ptr.Deref(ws.Status.Message, "")}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for workspace %s/%s (phase %s: %s): %w", ws.Namespace, ws.Name,
				ptr.Deref(ws.Status.Phase, "Pending"), ptr.Deref(ws.Status.Message, ""), ctx.Err())
		case ev, ok := <-wi.ResultChan():
			if !ok || ev.Type == watch.Error {
				return nil, nil
			}
			if ev.Type == watch.Deleted {
				return nil, &WorkspaceFailedError{Namespace: ws.Namespace, Name: ws.Name}
			}
			if next, ok := ev.Object.(*bashtaskv1alpha1.BashWorkspace); ok && ev.Type != watch.Bookmark {
				ws = next
			}
		}
	}
}
