package controllers

import (
	"context"
	"slices"

	"github.com/google/btree"
)

// waitStream names one ordered stream of waiting tasks: those of one
// owner ("" for tasks without one), assigned or not (see
// fairShare.refused). Within a stream every task's running count in the
// turn order is the same, so the stream's own order, by creation, first
// sight and key, is the turn order's.
type waitStream struct {
	owner    string
	assigned bool
}

// waitQueue holds the waiting tasks of the turns in streams, each a B-tree
// in turn order, so that a decision reads the few tasks at the heads of
// the streams, not every waiting task: with tens of thousands waiting
// (a burst of creates far beyond the agents' slots), a scan of all of them
// on every placement made the controller's CPU per task grow with the
// backlog (docs/scaling.md, "A backlog of waiting tasks").
type waitQueue struct {
	streams map[waitStream]*btree.BTreeG[*waiter]
	// visited counts the waiting tasks decisions looked at, for tests.
	visited int
}

// waiterLess is the order within a stream: turnOrder, whose running
// counts are equal there.
func waiterLess(a, b *waiter) bool { return turnOrder(a.contender, b.contender) < 0 }

// streamOf is w's stream.
func streamOf(w *waiter) waitStream { return waitStream{owner: w.owner, assigned: w.assigned} }

// add puts w in its stream; w's owner, assigned flag, creation, first
// sight and key must not change until it is removed.
func (q *waitQueue) add(w *waiter) {
	if q.streams == nil {
		q.streams = map[waitStream]*btree.BTreeG[*waiter]{}
	}
	s := streamOf(w)
	t := q.streams[s]
	if t == nil {
		t = btree.NewG(16, waiterLess)
		q.streams[s] = t
	}
	t.ReplaceOrInsert(w)
}

// remove takes w out of its stream.
func (q *waitQueue) remove(w *waiter) {
	s := streamOf(w)
	if t := q.streams[s]; t != nil {
		t.Delete(w)
		if t.Len() == 0 {
			delete(q.streams, s)
		}
	}
}

// head is a stream's first waiting task not yet visited that fits, with
// the running count the turn order gives its stream.
type head struct {
	c    contender
	w    *waiter
	tree *btree.BTreeG[*waiter]
}

// firstFit returns the first task of t from after (exclusive; nil: from
// the start) that fits, or nil.
func (q *waitQueue) firstFit(t *btree.BTreeG[*waiter], after *waiter, fits func(*waiter) bool) *waiter {
	var found *waiter
	visit := func(w *waiter) bool {
		if w == after {
			return true
		}
		q.visited++
		if fits(w) {
			found = w
			return false
		}
		return true
	}
	if after == nil {
		t.Ascend(visit)
	} else {
		t.AscendGreaterOrEqual(after, visit)
	}
	return found
}

// inTurn calls yield with the waiting tasks that fit, in turn order, each
// with its running count as the turn order takes it, until yield returns
// false or none is left. It reads each stream's owner count once
// (counts), and only as many tasks of a stream as it yields, plus those
// of the stream that do not fit.
func (q *waitQueue) inTurn(ctx context.Context, counts *ownerCounts, fits func(*waiter) bool, yield func(contender, *waiter) bool) error {
	heads := make([]head, 0, len(q.streams))
	for s, t := range q.streams {
		w := q.firstFit(t, nil, fits)
		if w == nil {
			continue
		}
		n, err := counts.of(ctx, s.owner)
		if err != nil {
			return err
		}
		c := w.contender
		c.running = w.ownRunning(n)
		heads = append(heads, head{c: c, w: w, tree: t})
	}
	byTurn := func(a, b head) int { return turnOrder(a.c, b.c) }
	slices.SortFunc(heads, byTurn)
	for len(heads) > 0 {
		h := heads[0]
		if !yield(h.c, h.w) {
			return nil
		}
		heads = heads[1:]
		w := q.firstFit(h.tree, h.w, fits)
		if w == nil {
			continue
		}
		c := w.contender
		c.running = h.c.running
		nh := head{c: c, w: w, tree: h.tree}
		i, _ := slices.BinarySearchFunc(heads, nh, byTurn)
		heads = slices.Insert(heads, i, nh)
	}
	return nil
}
