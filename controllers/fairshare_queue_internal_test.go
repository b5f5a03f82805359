package controllers

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"
)

// turnState is the turns' state for one decision: the waiting tasks, the
// running count of each owner, the free slots and the task deciding.
type turnState struct {
	f      *fairShare
	counts map[string]int
	free   map[string]int
	me     contender
}

// randomTurnState makes n waiting tasks of up to four owners, a share of
// them assigned to one node, each fitting a random subset of six nodes,
// and a deciding task among or after them.
func randomTurnState(r *rand.Rand, n int) turnState {
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	nodes := []string{"n0", "n1", "n2", "n3", "n4", "n5"}
	owners := []string{"", "a", "b", "c"}
	s := turnState{f: newFairShare(true), counts: map[string]int{}, free: map[string]int{}}
	for _, o := range owners {
		s.counts[o] = r.IntN(4)
	}
	for _, node := range nodes {
		if k := r.IntN(4) - 1; k > 0 {
			s.free[node] = k
		}
	}
	for i := range n {
		w := &waiter{
			contender: contender{
				key: types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", r.IntN(2)), Name: fmt.Sprintf("t-%d", i)},
				// Many share a second, as creationTimestamp does.
				created: t0.Add(time.Duration(r.IntN(n/4+1)) * time.Second),
				since:   t0.Add(time.Duration(r.IntN(1000)) * time.Millisecond),
			},
			owner: owners[r.IntN(len(owners))],
			nodes: map[string]bool{},
		}
		if r.IntN(8) == 0 {
			w.assigned = true
			w.nodes[nodes[r.IntN(len(nodes))]] = true
		} else {
			for _, node := range nodes {
				if r.IntN(3) > 0 {
					w.nodes[node] = true
				}
			}
		}
		s.f.wait(w)
	}
	s.me = contender{key: types.NamespacedName{Namespace: "ns-0", Name: "me"}, running: r.IntN(4), created: t0.Add(time.Duration(r.IntN(n/4+1)) * time.Second), since: t0}
	if keys := slices.Collect(maps.Keys(s.f.waiting)); len(keys) > 0 && r.IntN(2) == 0 {
		// The deciding task waits itself.
		w := s.f.waiting[keys[r.IntN(len(keys))]]
		s.me = w.contender
		s.me.running = w.ownRunning(s.counts[w.owner])
	}
	return s
}

// bruteCandidates is every waiting task with its running count, sorted
// in turn order: the definition the queue's order must match.
func bruteCandidates(s turnState) ([]contender, map[types.NamespacedName]*waiter) {
	var all []contender
	for _, w := range s.f.waiting {
		c := w.contender
		c.running = w.ownRunning(s.counts[w.owner])
		all = append(all, c)
	}
	slices.SortFunc(all, turnOrder)
	return all, s.f.waiting
}

// bruteAhead is the claims by their definition: every waiting task before
// me that fits a free node, sorted, then claimSlots.
func bruteAhead(s turnState) (map[string]int, []types.NamespacedName) {
	all, ws := bruteCandidates(s)
	var ahead []claimant
	for _, c := range all {
		if c.key != s.me.key && fitsAny(ws[c.key].nodes, s.free) && turnOrder(c, s.me) < 0 {
			ahead = append(ahead, claimant{key: c.key, nodes: ws[c.key].nodes})
		}
	}
	return claimSlots(s.free, ahead)
}

// bruteFirst is the next tasks for node by their definition.
func bruteFirst(s turnState, node string, slots int) []types.NamespacedName {
	all, ws := bruteCandidates(s)
	var out []types.NamespacedName
	for _, c := range all {
		if ws[c.key].nodes[node] && len(out) < slots {
			out = append(out, c.key)
		}
	}
	return out
}

// TestTurnsMatchBruteForce checks the queue's decisions, the claims of the
// tasks ahead and the next tasks for a node, against the turn order by its
// definition (every waiting task sorted) over random states, also after
// tasks leave and become assigned.
func TestTurnsMatchBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 4))
	empty := cmpopts.EquateEmpty()
	for round := range 300 {
		s := randomTurnState(r, r.IntN(60))
		for step := range 3 {
			counts := &ownerCounts{n: maps.Clone(s.counts)}
			claimed, winners, err := s.f.ahead(t.Context(), counts, s.me, s.free)
			if err != nil {
				t.Fatal(err)
			}
			wantClaimed, wantWinners := bruteAhead(s)
			if d := cmp.Diff(wantClaimed, claimed, empty); d != "" {
				t.Fatalf("round %d step %d: slots claimed (-want +got):\n%s", round, step, d)
			}
			if d := cmp.Diff(wantWinners, winners, empty); d != "" {
				t.Fatalf("round %d step %d: claimants (-want +got):\n%s", round, step, d)
			}
			node, slots := fmt.Sprintf("n%d", r.IntN(6)), 1+r.IntN(5)
			got, err := s.f.first(t.Context(), counts, node, slots)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(bruteFirst(s, node, slots), got, empty); d != "" {
				t.Fatalf("round %d step %d: next for %s (-want +got):\n%s", round, step, node, d)
			}
			// Some leave, one becomes assigned; the queue must follow.
			for _, k := range slices.Collect(maps.Keys(s.f.waiting)) {
				if r.IntN(4) == 0 {
					s.f.unwait(k)
				}
			}
			for k, w := range s.f.waiting {
				if !w.assigned {
					s.f.unwait(k)
					w.assigned, w.nodes = true, map[string]bool{"n0": true}
					s.f.wait(w)
					break
				}
			}
		}
		if got, want := len(s.f.queue.keys()), len(s.f.waiting); got != want {
			t.Fatalf("round %d: the queue holds %d tasks, the map %d", round, got, want)
		}
	}
}

// TestTurnDecisionReadsTheHeads holds a decision's work to the tasks that
// claim a slot and the heads of the owners' streams, not the backlog: with
// 10,000 tasks waiting, placing the newest looks at a handful of them (a
// scan of every waiting task looked at all 10,000 each time, and the
// controller's CPU per task grew with the backlog).
func TestTurnDecisionReadsTheHeads(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	f := newFairShare(true)
	all := map[string]bool{"n0": true, "n1": true, "n2": true}
	for i := range 10000 {
		f.wait(&waiter{
			contender: contender{key: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("t-%05d", i)}, created: t0.Add(time.Duration(i) * time.Millisecond), since: t0},
			owner:     []string{"a", "b", "c"}[i%3],
			nodes:     all,
		})
	}
	counts := &ownerCounts{n: map[string]int{"a": 5, "b": 5, "c": 5}}
	me := contender{key: types.NamespacedName{Namespace: "ns", Name: "new"}, running: 5, created: t0.Add(time.Hour), since: t0.Add(time.Hour)}
	free := map[string]int{"n0": 2, "n1": 1}
	_, winners, err := f.ahead(t.Context(), counts, me, free)
	if err != nil {
		t.Fatal(err)
	}
	if len(winners) != 3 || winners[0].Name != "t-00000" {
		t.Errorf("claimants %v; want the three waiting longest", winners)
	}
	if f.queue.visited > 10 {
		t.Errorf("the decision looked at %d waiting tasks; want at most 10 (3 claimants, 3 stream heads, their successors)", f.queue.visited)
	}
	f.queue.visited = 0
	next, err := f.first(t.Context(), counts, "n2", 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(next) != 4 || f.queue.visited > 10 {
		t.Errorf("next for n2: %v after looking at %d tasks; want 4 after at most 10", next, f.queue.visited)
	}
}

// BenchmarkTurnDecision measures one placement decision in the turns (the
// claims of the tasks ahead, and the next tasks for a freed slot) with a
// backlog of waiting tasks of eight owners, all fitting every node.
func BenchmarkTurnDecision(b *testing.B) {
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	nodes := map[string]bool{}
	free := map[string]int{}
	for i := range 100 {
		nodes[fmt.Sprintf("n%d", i)] = true
		if i%10 == 0 {
			free[fmt.Sprintf("n%d", i)] = 1
		}
	}
	for _, waiting := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			f := newFairShare(true)
			counts := map[string]int{}
			for i := range waiting {
				owner := fmt.Sprintf("o%d", i%8)
				counts[owner] = 16
				f.wait(&waiter{
					contender: contender{key: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("t-%d", i)}, created: t0.Add(time.Duration(i) * time.Millisecond), since: t0},
					owner:     owner, nodes: nodes,
				})
			}
			me := contender{key: types.NamespacedName{Namespace: "ns", Name: "new"}, running: 16, created: t0.Add(time.Hour), since: t0.Add(time.Hour)}
			b.ReportAllocs()
			for b.Loop() {
				c := &ownerCounts{n: maps.Clone(counts)}
				if _, _, err := f.ahead(b.Context(), c, me, free); err != nil {
					b.Fatal(err)
				}
				if _, err := f.first(b.Context(), c, "n0", 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// keys returns every waiting task's key in the queue.
func (q *waitQueue) keys() []types.NamespacedName {
	var out []types.NamespacedName
	for _, t := range q.streams {
		t.Ascend(func(w *waiter) bool { out = append(out, w.key); return true })
	}
	return out
}
