// Package client is a Go client of BashTasks for platforms: FollowLog
// reads a task's stdout or stderr through the output.bashtask.dev
// aggregated API (RBAC: get on bashtasks/log in that group), resuming at
// its offset after a dropped connection; Run creates a task and waits for
// its end; Cancel asks a task to stop; CopyTo and CopyFrom copy files
// into and out of a workspace. docs/output.md is the contract of the
// output, docs/workspaces.md (Copying files) of the copies.
package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Client talks to one cluster's API server.
type Client struct {
	base *url.URL
	http *http.Client
	k8s  ctrlclient.Client
}

// New returns a client for cfg (a kubeconfig's rest.Config).
func New(cfg *rest.Config) (*Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("bashtask client: %w", err)
	}
	base, err := url.Parse(cfg.Host)
	if err != nil || base.Host == "" {
		// A bare host:port, as kubeconfigs sometimes carry.
		if base, err = url.Parse("https://" + cfg.Host); err != nil {
			return nil, fmt.Errorf("bashtask client: host %q: %w", cfg.Host, err)
		}
	}
	scheme := runtime.NewScheme()
	if err := bashtaskv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	k, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme, HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("bashtask client: %w", err)
	}
	return &Client{base: base, http: hc, k8s: k}, nil
}

// Run creates task and waits until it has its terminal reason, then
// returns it as last read. ctx bounds the wait; the task keeps running
// when ctx ends first. The wait reads the task every poll interval
// (500 ms): Run is for scripts and tests, FollowLog for output.
func (c *Client) Run(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	if err := c.k8s.Create(ctx, task); err != nil {
		return nil, fmt.Errorf("creating BashTask %s/%s: %w", task.Namespace, task.Name, err)
	}
	key := ctrlclient.ObjectKeyFromObject(task)
	uid := task.UID
	var got bashtaskv1alpha1.BashTask
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.k8s.Get(ctx, key, &got); err != nil {
			return false, err
		}
		if got.UID != uid {
			return false, ErrTaskReplaced
		}
		return got.Status.Reason != nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for BashTask %s: %w", key, err)
	}
	return &got, nil
}

// Cancel asks the task to stop (spec.cancelRequested: SIGTERM, grace,
// SIGKILL); it is idempotent. uid, when set, must be the task's: the merge
// patch carries it as metadata.uid, and since a UID is immutable the API
// server refuses the patch of a task of the same name made again since
// (422, field metadata.uid). Cancel returns that refusal as an error
// wrapping ErrTaskReplaced, and the new task is not cancelled.
func (c *Client) Cancel(ctx context.Context, ns, name string, uid types.UID) error {
	patch := `{"spec":{"cancelRequested":true}}`
	if uid != "" {
		patch = fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{"cancelRequested":true}}`, uid)
	}
	t := &bashtaskv1alpha1.BashTask{}
	t.Namespace, t.Name = ns, name
	err := c.k8s.Patch(ctx, t, ctrlclient.RawPatch(types.MergePatchType, []byte(patch)))
	if uid != "" && uidRefused(err) {
		return fmt.Errorf("cancelling BashTask %s/%s (uid %s): %w: %w", ns, name, uid, ErrTaskReplaced, err)
	}
	if err != nil {
		return fmt.Errorf("cancelling BashTask %s/%s: %w", ns, name, err)
	}
	return nil
}

// uidRefused reports whether err is the API server's refusal of a change
// of metadata.uid (an Invalid status with a cause on that field): the
// precondition of a patch that names the UID it was meant for.
func uidRefused(err error) bool {
	var se apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &se) || se.Status().Details == nil {
		return false
	}
	for _, c := range se.Status().Details.Causes {
		if c.Field == "metadata.uid" {
			return true
		}
	}
	return false
}
