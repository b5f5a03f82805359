package controllers

import (
	"testing"
	"time"

	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// A Ready workspace that runs no task and injects no Secret is read from
// its agent every WorkspaceIdleRefreshInterval; one that runs a task, or
// whose egress injects a Secret (whose new value reaches the agent only at
// a read), every WorkspaceRefreshInterval; an idle interval of zero turns
// the difference off.
func TestWorkspaceRefreshInterval(t *testing.T) {
	const busy, quiet = 30 * time.Second, 10 * time.Minute
	inject := &bashtaskv1alpha1.EgressPolicy{Inject: []bashtaskv1alpha1.EgressInjection{{Domain: "api.example.com"}}}
	for _, tc := range []struct {
		name    string
		running int32
		egress  *bashtaskv1alpha1.EgressPolicy
		idle    time.Duration
		want    time.Duration
	}{
		{"no task", 0, nil, quiet, quiet},
		{"a running task", 2, nil, quiet, busy},
		{"no task, a Secret injected", 0, inject, quiet, busy},
		{"no task, egress without injection", 0, &bashtaskv1alpha1.EgressPolicy{}, quiet, quiet},
		{"no task, idle interval off", 0, nil, 0, busy},
	} {
		opts := DefaultOptions()
		opts.WorkspaceRefreshInterval, opts.WorkspaceIdleRefreshInterval = busy, tc.idle
		r := NewBashWorkspaceReconciler(nil, nil, nil, nil, nil, opts)
		ws := &bashtaskv1alpha1.BashWorkspace{}
		ws.Spec.Egress = tc.egress
		ws.Status.RunningTasks = ptr.To(tc.running)
		if got := r.refreshInterval(ws); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}
