package controllers

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// TestTurnOrder checks the rule of the fair turns: the owner that runs the
// fewest tasks first, then the task created first, then the one seen
// waiting first, then by namespace and name.
func TestTurnOrder(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	c := func(name string, running int, created, since time.Duration) contender {
		return contender{key: types.NamespacedName{Namespace: "ns", Name: name}, running: running, created: t0.Add(created), since: t0.Add(since)}
	}
	got := []contender{
		c("burst-late", 6, 3*time.Second, 3*time.Second),
		c("burst-early", 6, 0, 0),
		c("newcomer", 0, 10*time.Second, 10*time.Second),
		c("same-second-seen-later", 2, time.Second, 2*time.Second),
		c("same-second-seen-first", 2, time.Second, time.Second+time.Millisecond),
		c("tie-b", 2, 5*time.Second, 5*time.Second),
		c("tie-a", 2, 5*time.Second, 5*time.Second),
	}
	slices.SortFunc(got, turnOrder)
	var names []string
	for _, x := range got {
		names = append(names, x.key.Name)
	}
	want := []string{"newcomer", "same-second-seen-first", "same-second-seen-later", "tie-a", "tie-b", "burst-early", "burst-late"}
	if !slices.Equal(names, want) {
		t.Errorf("turn order %v, want %v", names, want)
	}
}

// TestClaimSlots checks how the waiting tasks ahead take the free slots:
// in turn order, each on the agent it fits with the most slots left, and
// only on agents it fits.
func TestClaimSlots(t *testing.T) {
	key := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	on := func(nodes ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range nodes {
			m[n] = true
		}
		return m
	}
	for name, tc := range map[string]struct {
		free        map[string]int
		ahead       []claimant
		wantClaimed map[string]int
		wantWinners []string
	}{
		"one slot, the first in turn takes it": {
			free:        map[string]int{"a": 1},
			ahead:       []claimant{{key("b1"), on("a")}, {key("a3"), on("a")}},
			wantClaimed: map[string]int{"a": 1}, wantWinners: []string{"b1"},
		},
		"a task that fits elsewhere claims nothing here": {
			free:        map[string]int{"a": 1},
			ahead:       []claimant{{key("pinned-z"), on("z")}, {key("b1"), on("a", "z")}},
			wantClaimed: map[string]int{"a": 1}, wantWinners: []string{"b1"},
		},
		"the agent with the most slots left first, ties by name": {
			free:        map[string]int{"a": 1, "b": 2, "c": 2},
			ahead:       []claimant{{key("x"), on("a", "b", "c")}, {key("y"), on("a", "b", "c")}, {key("z"), on("a", "b", "c")}},
			wantClaimed: map[string]int{"a": 1, "b": 1, "c": 1}, wantWinners: []string{"x", "y", "z"},
		},
		"more tasks ahead than slots": {
			free:        map[string]int{"a": 2},
			ahead:       []claimant{{key("1"), on("a")}, {key("2"), on("a")}, {key("3"), on("a")}},
			wantClaimed: map[string]int{"a": 2}, wantWinners: []string{"1", "2"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			claimed, winners := claimSlots(tc.free, tc.ahead)
			var names []string
			for _, w := range winners {
				names = append(names, w.Name)
			}
			if !slices.Equal(names, tc.wantWinners) {
				t.Errorf("winners %v, want %v", names, tc.wantWinners)
			}
			for n, k := range tc.wantClaimed {
				if claimed[n] != k {
					t.Errorf("claimed on %s: %d, want %d (all: %v)", n, claimed[n], k, claimed)
				}
			}
			if len(claimed) != len(tc.wantClaimed) {
				t.Errorf("claimed %v, want %v", claimed, tc.wantClaimed)
			}
		})
	}
}

// TestFreeSlots checks the free slots a decision sees: only ready agents
// with a capacity, less the slots held for tasks whose Start has not
// returned.
func TestFreeSlots(t *testing.T) {
	agents := []agentpool.AgentState{
		{Node: "a", Ready: true, Capacity: 2, Running: 1},
		{Node: "b", Ready: true, Capacity: 2, Running: 0},
		{Node: "full", Ready: true, Capacity: 2, Running: 2},
		{Node: "not-ready", Capacity: 2},
		{Node: "unlimited", Ready: true},
	}
	got := freeSlots(agents, map[string]int{"b": 1})
	want := map[string]int{"a": 1, "b": 1}
	if len(got) != len(want) || got["a"] != 1 || got["b"] != 1 {
		t.Errorf("free slots %v, want %v", got, want)
	}
	view := slotView{agents: fixedAgents(agents), extra: map[string]int{"a": 1}}
	if a := view.Agent("a"); a.Running != 2 {
		t.Errorf("the view's running count of a is %d, want 2 (1 running, 1 held)", a.Running)
	}
}

// fixedAgents is an agentLister over a fixed list.
type fixedAgents []agentpool.AgentState

func (f fixedAgents) Agents() []agentpool.AgentState { return slices.Clone(f) }

func (f fixedAgents) Agent(node string) agentpool.AgentState {
	for _, a := range f {
		if a.Node == node {
			return a
		}
	}
	return agentpool.AgentState{Node: node}
}

// TestWorkspaceAgentSeesTheTurns checks that a task of a workspace, which
// can only go to its workspace's node, takes its turn there too: a slot
// that a waiting task ahead claims is not free for it.
func TestWorkspaceAgentSeesTheTurns(t *testing.T) {
	agents := fixedAgents{{Node: "w", Ready: true, Capacity: 2, Running: 1}}
	target := &workspaceTarget{ref: &agentv1.WorkspaceRef{Name: "s1"}, node: "w"}
	if pl := workspaceAgent(slotView{agents: agents}, target); pl.agent == nil {
		t.Fatalf("with one slot free and no turn claimed: %s, want the agent", pl.why)
	}
	pl := workspaceAgent(slotView{agents: agents, extra: map[string]int{"w": 1}}, target)
	if pl.agent != nil || pl.reason != ReasonNoAgent {
		t.Errorf("with the free slot claimed: agent %v, reason %q, want none and %s", pl.agent, pl.reason, ReasonNoAgent)
	}
}

// TestRefusedStartWaitsInTurn checks the record of a task whose Start its
// agent refused as full: it gives up its held slot, waits for a slot on
// its own node only, keeps the place in the turn order it had when it was
// first seen waiting, stays waiting while the cache shows it dispatched
// and leaves when it ends; its owner's count leaves it out.
func TestRefusedStartWaitsInTurn(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	f := newFairShare(true)
	bt := &bashtaskv1alpha1.BashTask{}
	bt.Namespace, bt.Name = "ns", "refused"
	bt.CreationTimestamp.Time = t0
	key := types.NamespacedName{Namespace: "ns", Name: "refused"}
	f.enter(bt, t0.Add(time.Second), func() map[string]bool { return map[string]bool{"a": true, "b": true} })
	f.hold(key, "a", "", t0.Add(2*time.Second))
	if f.waiting[key] != nil || f.placed[key] == nil {
		t.Fatalf("after hold: waiting %v, placed %v; want placed only", f.waiting[key], f.placed[key])
	}
	f.refused(bt, "a", t0.Add(3*time.Second))
	w := f.waiting[key]
	switch {
	case f.placed[key] != nil:
		t.Errorf("the refused task still holds a slot: %+v", f.placed[key])
	case w == nil || !w.assigned:
		t.Fatalf("the refused task is not an assigned waiter: %+v", w)
	case len(w.nodes) != 1 || !w.nodes["a"]:
		t.Errorf("the refused task waits for %v, want its node a only", w.nodes)
	case !w.since.Equal(t0.Add(time.Second)):
		t.Errorf("the refused task's place is from %v, want %v (when first seen waiting)", w.since, t0.Add(time.Second))
	}
	if got := w.ownRunning(3); got != 2 {
		t.Errorf("owner count of an assigned waiter from 3: %d, want 2", got)
	}
	f.seen(key, false)
	if !f.assignedWaiting(key) {
		t.Error("seen dispatched, the refused task no longer waits")
	}
	f.seen(key, true)
	if f.waiting[key] != nil {
		t.Error("seen terminal, the refused task still waits")
	}

	off := newFairShare(false)
	off.hold(key, "a", "", t0)
	off.refused(bt, "a", t0)
	if off.placed[key] != nil || off.waiting[key] != nil {
		t.Errorf("without the turns: placed %v, waiting %v; want neither", off.placed[key], off.waiting[key])
	}
}

// claimSlots gives the free slots to the claimants, which come in turn
// order (see slotClaims), and returns the slots claimed per node and who
// claimed them: the claims of a decision by their definition.
func claimSlots(free map[string]int, ahead []claimant) (map[string]int, []types.NamespacedName) {
	cl := newSlotClaims(free)
	for _, c := range ahead {
		cl.claim(c)
	}
	return cl.claimed, cl.winners
}
