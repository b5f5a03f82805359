package controllers

import (
	"fmt"
	"math/rand/v2"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// countState is one state of an owner count: the running tasks the cache
// lists for the owner, and the tasks this process placed, of any owner.
type countState struct {
	items  []bashtaskv1alpha1.BashTask
	placed map[types.NamespacedName]*placedTask
}

// randomCountState makes a state of n listed tasks and n placed ones, a
// share of them listed too, over three owners and two namespaces.
func randomCountState(r *rand.Rand, n int) countState {
	key := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%2), Name: fmt.Sprintf("t-%d", i)}
	}
	s := countState{placed: map[types.NamespacedName]*placedTask{}}
	for range n {
		k := key(r.IntN(3 * n))
		s.items = append(s.items, bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}})
	}
	owners := []string{"", "a", "b"}
	for range n {
		s.placed[key(r.IntN(3*n))] = &placedTask{owner: owners[r.IntN(len(owners))]}
	}
	return s
}

// bruteUnlisted is placedUnlisted by its definition: each placed task of
// owner looked for in items one by one.
func bruteUnlisted(s countState, owner string) int {
	n := 0
	for key, p := range s.placed {
		found := false
		for i := range s.items {
			found = found || (s.items[i].Namespace == key.Namespace && s.items[i].Name == key.Name)
		}
		if p.owner == owner && !found {
			n++
		}
	}
	return n
}

// TestPlacedUnlistedMatchesBruteForce checks the owner count's placed
// share against the count by definition over random states.
func TestPlacedUnlistedMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 2))
	for round := range 200 {
		s := randomCountState(r, r.IntN(40))
		for _, owner := range []string{"", "a", "b", "c"} {
			if got, want := placedUnlisted(s.placed, owner, s.items), bruteUnlisted(s, owner); got != want {
				t.Fatalf("round %d, owner %q: %d placed and not listed, want %d", round, owner, got, want)
			}
		}
	}
}

// BenchmarkOwnerCount measures the placed share of one owner count with
// 10,000 running tasks listed and 10,000 placed (make bench-controllers;
// docs/scaling.md). TestPlacedUnlistedMatchesBruteForce checks the count.
func BenchmarkOwnerCount(b *testing.B) {
	s := randomCountState(rand.New(rand.NewPCG(38, 4)), 10000)
	for b.Loop() {
		placedUnlisted(s.placed, "", s.items)
	}
}
