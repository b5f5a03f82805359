package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestWriteTracker(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	written := func(rv string) *bashtaskv1alpha1.BashTask {
		return &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, ResourceVersion: rv}}
	}
	type step struct {
		wrote  string // resourceVersion returned by a write; empty: no write
		cached string // resourceVersion the cache shows next
		stale  bool
	}
	tests := map[string][]step{
		"no write is never stale": {{cached: "5"}},
		"older cache is stale until it catches up": {
			{wrote: "10", cached: "9", stale: true},
			{cached: "9", stale: true},
			{cached: "10"},
			{cached: "9"}, // entry dropped once caught up
		},
		"newer cache (someone else wrote) is fresh": {{wrote: "10", cached: "11"}},
		// A version with more digits is larger, however the strings sort.
		"compared as integers, not strings": {{wrote: "100", cached: "99", stale: true}, {cached: "100"}},
		"not an integer: never stale":       {{wrote: "abc", cached: "9"}, {wrote: "10", cached: "x"}},
		"each write moves the mark":         {{wrote: "10", cached: "10"}, {wrote: "12", cached: "11", stale: true}},
	}
	for name, steps := range tests {
		t.Run(name, func(t *testing.T) {
			w := newWriteTracker()
			for i, s := range steps {
				if s.wrote != "" {
					w.wrote(written(s.wrote))
				}
				if got := w.stale(key, s.cached); got != s.stale {
					t.Errorf("step %d: stale(cached %q) = %v, want %v", i, s.cached, got, s.stale)
				}
			}
		})
	}

	w := newWriteTracker()
	w.wrote(written("10"))
	w.forget(key)
	if w.stale(key, "9") {
		t.Error("stale after forget: the entry of a deleted object must go")
	}
	if n := len(w.written); n != 0 {
		t.Errorf("%d entries left, want 0", n)
	}
}
