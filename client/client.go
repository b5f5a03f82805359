// Package client is a Go client of BashTasks for platforms: Run creates a
// task, streams its stdout and stderr to writers while it runs and returns
// its exit code; Start creates one detached, whose output FollowLog reads
// later from any byte offset through the output.bashtask.dev aggregated
// API (RBAC: get on bashtasks/log in that group), resuming at its offset
// after a dropped connection; Cancel asks a task to stop; the workspace
// helpers create, read, wait for, suspend, resume and delete
// BashWorkspaces; CopyTo and CopyFrom copy files into and out of a
// workspace; PortForward forwards local TCP ports to ports on a
// workspace's loopback (docs/portforward.md). Every wait is a watch of the
// object, never a poll.
// docs/output.md is the contract of the output, docs/workspaces.md
// (Copying files) of the copies, docs/client.md of Run and its options.
package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Client talks to one cluster's API server. It is safe for concurrent use;
// a platform makes one and keeps it.
type Client struct {
	// cfg is for the streaming upgrades of Attach and PortForward.
	cfg  *rest.Config
	base *url.URL
	http *http.Client
	k8s  ctrlclient.WithWatch
}

// RESTMapper maps the kinds of bashtask.dev/v1alpha1 (BashTask,
// BashWorkspace) to their resources without asking the API server: a
// client built on it makes no discovery request, which on a command's
// path would cost round trips before its first real call. A cluster that
// does not serve the kinds answers the first call 404 instead.
func RESTMapper() *meta.DefaultRESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(bashtaskv1alpha1.GroupVersion.WithKind("BashTask"), meta.RESTScopeNamespace)
	m.Add(bashtaskv1alpha1.GroupVersion.WithKind("BashWorkspace"), meta.RESTScopeNamespace)
	return m
}

// Client-side limits of a client whose rest.Config leaves QPS and Burst
// unset: client-go's own defaults (5 and 10) would hold a platform to
// about 2.5 commands a second, a command costing a create and a watch.
const (
	DefaultQPS   = 100
	DefaultBurst = 200
)

// New returns a client for cfg (a kubeconfig's rest.Config). It makes no
// request: the kinds are mapped by RESTMapper. cfg's QPS and Burst bound
// its API calls; unset (0), they are DefaultQPS and DefaultBurst.
func New(cfg *rest.Config) (*Client, error) {
	if cfg.QPS == 0 && cfg.Burst == 0 && cfg.RateLimiter == nil {
		cfg = rest.CopyConfig(cfg)
		cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	}
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
	k, err := ctrlclient.NewWithWatch(cfg, ctrlclient.Options{Scheme: scheme, HTTPClient: hc, Mapper: RESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("bashtask client: %w", err)
	}
	return &Client{base: base, http: hc, k8s: k, cfg: rest.CopyConfig(cfg)}, nil
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
