package controllers_test

import (
	"fmt"
	"math"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// The running controller counts a node's workspaces for placement from its
// cache without copying them: with 100 workspaces on a node the count is
// right and costs a few allocations, not one or more per workspace as a
// list of deep copies does (docs/scaling.md).
func TestWorkspaceCountCopiesNothing(t *testing.T) {
	const n, node = 100, "count-node"
	ns := newNamespace(t)
	g := NewWithT(t)
	ctx := t.Context()
	for i := range n {
		ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("ws-%d", i)}}
		g.Expect(k8s.Create(ctx, ws)).To(Succeed())
		g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(ws), ws); err != nil {
				return err
			}
			ws.Status.NodeName = ptr.To(node)
			return k8s.Status().Update(ctx, ws)
		})).To(Succeed())
	}
	t.Cleanup(func() {
		_ = k8s.DeleteAllOf(ctxBackground(), &v1.BashWorkspace{}, client.InNamespace(ns))
	})
	g.Eventually(func() int { return controllers.WorkspacesOn(ctx, rig.Workspaces, node) }).
		WithTimeout(waitLong).Should(Equal(n))
	// AllocsPerRun counts the whole process's allocations, the running
	// controller's too: the fewest of several samples is the count's own.
	allocs := math.Inf(1)
	for range 5 {
		allocs = min(allocs, testing.AllocsPerRun(50, func() { controllers.WorkspacesOn(ctx, rig.Workspaces, node) }))
	}
	if allocs > n/4 {
		t.Errorf("counting %d workspaces took %.0f allocations: the count copies them", n, allocs)
	}
}
