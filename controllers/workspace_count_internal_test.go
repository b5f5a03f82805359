package controllers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// TestWorkspaceCountMatchesBruteForce applies random creates, moves,
// unplacements and deletes of workspaces to a store indexed as the
// controller's cache is (workspaceNodeIndex), and checks after each step
// that placement's count of every node equals a count over every stored
// workspace.
func TestWorkspaceCountMatchesBruteForce(t *testing.T) {
	store := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{workspaceNodeIndex: workspaceNode})
	r := &BashWorkspaceReconciler{byNode: store}
	nodes := []string{"", "node-1", "node-2", "node-3"}
	rnd := rand.New(rand.NewPCG(38, 5))
	for step := range 2000 {
		ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{
			Namespace: fmt.Sprintf("ns-%d", rnd.IntN(2)), Name: fmt.Sprintf("ws-%d", rnd.IntN(50))}}
		if n := nodes[rnd.IntN(len(nodes))]; n != "" {
			ws.Status.NodeName = ptr.To(n)
		}
		var err error
		if rnd.IntN(4) == 0 {
			err = store.Delete(ws)
		} else {
			err = store.Update(ws) // adds or replaces
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes[1:] {
			want := 0
			for _, o := range store.List() {
				if ptr.Deref(o.(*bashtaskv1alpha1.BashWorkspace).Status.NodeName, "") == n {
					want++
				}
			}
			if got := r.workspacesOn(context.Background(), n); got != want {
				t.Fatalf("step %d: %d workspaces counted on %s, %d stored", step, got, n, want)
			}
		}
	}
}

// BenchmarkWorkspaceLoad measures one agent's rank in a workspace's
// placement with 10,000 workspaces on 100 nodes.
func BenchmarkWorkspaceLoad(b *testing.B) {
	store := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{workspaceNodeIndex: workspaceNode})
	for i := range 10000 {
		ws := &bashtaskv1alpha1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("ws-%d", i)}}
		ws.Status.NodeName = ptr.To(fmt.Sprintf("node-%d", i%100))
		if err := store.Add(ws); err != nil {
			b.Fatal(err)
		}
	}
	r := &BashWorkspaceReconciler{byNode: store}
	for b.Loop() {
		r.workspacesOn(b.Context(), "node-7")
	}
}
