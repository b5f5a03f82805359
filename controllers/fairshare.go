package controllers

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// waiterRefresh is how long the agents a waiting task fits are kept before
// its next pass measures them again (a Node's labels or an agent's
// capabilities may change meanwhile).
const waiterRefresh = 30 * time.Second

// wakeBuffer is the capacity of the channel that wakes waiting tasks; a
// wake that finds it full is dropped, and the task's retry interval
// brings it back instead.
const wakeBuffer = 1024

// fairShare hands the agents' free task slots (--max-concurrent-tasks)
// to the tasks that wait for them in fair turns (docs/controller.md,
// "Fair turns"): the waiting task whose owner runs the fewest tasks
// first, then the one that waited longest. It also holds the slot of a
// task placed by this process until the agent's Start returns, so that
// concurrent workers never hand out one slot twice. Its maps live in the
// leader's memory: after a restart the waiting tasks enter again on their
// next pass, within the retry interval.
type fairShare struct {
	// enabled turns the turns on (--fair-share); the held slots apply
	// either way.
	enabled bool
	// mu serializes placement decisions: a decision reads the waiting
	// tasks and the held slots and changes them before the next starts.
	mu sync.Mutex
	// waiting are the tasks waiting for a slot, by key; queue holds the
	// same tasks in turn order. Change both through wait and unwait.
	waiting map[types.NamespacedName]*waiter
	queue   waitQueue
	// placed are the tasks placed by this process whose dispatch the
	// cache may not show yet, by key.
	placed map[types.NamespacedName]*placedTask
	// wake carries the waiting tasks whose turn has come to the
	// reconciler's queue.
	wake chan event.TypedGenericEvent[*bashtaskv1alpha1.BashTask]
}

// waiter is a task waiting for a task slot.
type waiter struct {
	contender
	// owner is the task's spec.owner, "" for none.
	owner string
	// nodes are the agents the task fits when capacity is left aside.
	nodes map[string]bool
	// measured is when nodes were computed.
	measured time.Time
	// assigned marks a task already dispatched to the one node in nodes
	// whose Start that node's agent refused as full (ResourceExhausted):
	// it waits there in turn like any other, and the owner's running
	// count, which the cache's dispatch includes, leaves it out.
	assigned bool
}

// placedTask is a task placed by this process: it holds a slot on node
// until its Start returned, and counts for its owner until the cache
// shows it dispatched.
type placedTask struct {
	node, owner string
	// started is set once the agent's Start returned: the registry's
	// running count has the task from then on (or it ended).
	started bool
	// since is when the task was first seen waiting, kept for the turn
	// order should the agent refuse its Start.
	since time.Time
}

// contender is a task competing for a slot, as the turn order sees it.
type contender struct {
	key types.NamespacedName
	// running is how many tasks its owner runs now.
	running int
	// created is its creationTimestamp: the longest waiting was created
	// first.
	created time.Time
	// since is when this process first saw it wait, which orders tasks
	// created within the same second.
	since time.Time
}

// claimant is a waiting task ahead in the turn order, with the agents it
// could take a slot on.
type claimant struct {
	key   types.NamespacedName
	nodes map[string]bool
}

func newFairShare(enabled bool) *fairShare {
	return &fairShare{
		enabled: enabled,
		waiting: map[types.NamespacedName]*waiter{},
		placed:  map[types.NamespacedName]*placedTask{},
		wake:    make(chan event.TypedGenericEvent[*bashtaskv1alpha1.BashTask], wakeBuffer),
	}
}

// turnOrder orders two contenders for a slot: the one whose owner runs
// fewer tasks first, then the one created first, then the one seen
// waiting first, then by namespace and name, so that the order is total.
func turnOrder(a, b contender) int {
	return cmp.Or(
		cmp.Compare(a.running, b.running),
		a.created.Compare(b.created),
		a.since.Compare(b.since),
		cmp.Compare(a.key.Namespace, b.key.Namespace),
		cmp.Compare(a.key.Name, b.key.Name),
	)
}

// slotClaims gives free slots (node to free slots) to claimants that
// come in turn order: each takes one slot on the agent among its nodes
// with the most slots left (ties by node name), as placement would take
// the least loaded. A claimant that fits no node with a slot left claims
// nothing.
type slotClaims struct {
	left      map[string]int
	nodes     []string
	remaining int
	// claimed are the slots claimed per node, winners who claimed them.
	claimed map[string]int
	winners []types.NamespacedName
}

func newSlotClaims(free map[string]int) *slotClaims {
	cl := &slotClaims{left: maps.Clone(free), nodes: slices.Sorted(maps.Keys(free)), claimed: map[string]int{}}
	for _, k := range free {
		cl.remaining += max(k, 0)
	}
	return cl
}

// claim gives c a slot if one of its nodes has one left.
func (cl *slotClaims) claim(c claimant) {
	best := ""
	for _, n := range cl.nodes {
		if cl.left[n] > 0 && c.nodes[n] && (best == "" || cl.left[n] > cl.left[best]) {
			best = n
		}
	}
	if best == "" {
		return
	}
	cl.left[best]--
	cl.remaining--
	cl.claimed[best]++
	cl.winners = append(cl.winners, c.key)
}

// slotView is the agents as one placement sees them: each agent's running
// count raised by extra, the slots held for tasks placed by this process
// and those claimed by waiting tasks ahead of the one placed.
type slotView struct {
	agents agentLister
	extra  map[string]int
}

// Agents returns every agent's state with its running count raised.
func (v slotView) Agents() []agentpool.AgentState {
	all := v.agents.Agents()
	for i := range all {
		all[i].Running += v.extra[all[i].Node]
	}
	return all
}

// Agent returns one node's agent with its running count raised.
func (v slotView) Agent(node string) agentpool.AgentState {
	a := v.agents.Agent(node)
	a.Running += v.extra[node]
	return a
}

// turnViews are the two views of one placement decision.
type turnViews struct {
	// held counts the slots held for placed tasks; claimed adds those the
	// waiting tasks ahead claim.
	held, claimed slotView
	// ahead are the waiting tasks that claimed a slot: woken when the task
	// placed loses its turn to them.
	ahead []types.NamespacedName
}

// views computes the views of bt's placement. The caller holds f.mu.
func (f *fairShare) views(ctx context.Context, c client.Reader, agents agentLister, bt *bashtaskv1alpha1.BashTask, now time.Time) (turnViews, error) {
	held := map[string]int{}
	for _, p := range f.placed {
		if !p.started {
			held[p.node]++
		}
	}
	v := turnViews{held: slotView{agents, held}, claimed: slotView{agents, held}}
	key := client.ObjectKeyFromObject(bt)
	if !f.enabled || len(f.waiting) == 0 || (len(f.waiting) == 1 && f.waiting[key] != nil) {
		return v, nil
	}
	free := freeSlots(agents.Agents(), held)
	if len(free) == 0 {
		return v, nil
	}
	counts := ownerCounts{reader: c, placed: f.placed, n: map[string]int{}}
	me, err := f.contenderOf(ctx, &counts, bt, now)
	if err != nil {
		return v, err
	}
	claimed, winners, err := f.ahead(ctx, &counts, me, free)
	if err != nil {
		return v, err
	}
	extra := maps.Clone(held)
	for n, k := range claimed {
		extra[n] += k
	}
	v.claimed, v.ahead = slotView{agents, extra}, winners
	return v, nil
}

// freeSlots returns, per ready agent with a capacity, its free slots
// after those held, leaving out agents with none.
func freeSlots(agents []agentpool.AgentState, held map[string]int) map[string]int {
	free := map[string]int{}
	for _, a := range agents {
		if !a.Ready || a.Capacity <= 0 {
			continue
		}
		if n := a.Capacity - a.Running - held[a.Node]; n > 0 {
			free[a.Node] = n
		}
	}
	return free
}

// contenderOf returns bt as the turn order sees it, with its owner's
// running tasks counted.
func (f *fairShare) contenderOf(ctx context.Context, counts *ownerCounts, bt *bashtaskv1alpha1.BashTask, now time.Time) (contender, error) {
	key := client.ObjectKeyFromObject(bt)
	n, err := counts.of(ctx, ptr.Deref(bt.Spec.Owner, ""))
	if err != nil {
		return contender{}, err
	}
	since := now
	if w := f.waiting[key]; w != nil {
		since, n = w.since, w.ownRunning(n)
	}
	return contender{key: key, running: n, created: bt.CreationTimestamp.Time, since: since}, nil
}

// ahead gives the free slots to the waiting tasks before me in the turn
// order (see slotClaims), and returns the slots claimed per node and
// who claimed them. It stops at me or once no slot is left, so that it
// reads the tasks that claim a slot, not every waiting task.
func (f *fairShare) ahead(ctx context.Context, counts *ownerCounts, me contender, free map[string]int) (map[string]int, []types.NamespacedName, error) {
	cl := newSlotClaims(free)
	fits := func(w *waiter) bool { return w.key != me.key && fitsAny(w.nodes, cl.left) }
	err := f.queue.inTurn(ctx, counts, fits, func(c contender, w *waiter) bool {
		if turnOrder(c, me) >= 0 {
			return false
		}
		cl.claim(claimant{key: c.key, nodes: w.nodes})
		return cl.remaining > 0
	})
	return cl.claimed, cl.winners, err
}

// fitsAny reports whether one of nodes has a free slot.
func fitsAny(nodes map[string]bool, free map[string]int) bool {
	for n, k := range free {
		if k > 0 && nodes[n] {
			return true
		}
	}
	return false
}

// ownerCounts counts the running tasks of owners for one decision, each
// owner once: the tasks the cache shows dispatched and not terminal
// (IndexRunningOwner), plus those placed by this process that the cache
// may not show yet.
type ownerCounts struct {
	reader client.Reader
	placed map[types.NamespacedName]*placedTask
	n      map[string]int
}

// of returns owner's running tasks ("" for tasks without an owner).
func (o *ownerCounts) of(ctx context.Context, owner string) (int, error) {
	if n, ok := o.n[owner]; ok {
		return n, nil
	}
	var list bashtaskv1alpha1.BashTaskList
	if err := o.reader.List(ctx, &list, client.MatchingFields{IndexRunningOwner: owner}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("counting the running tasks of owner %q: %w", owner, err)
	}
	n := len(list.Items) + placedUnlisted(o.placed, owner, list.Items)
	o.n[owner] = n
	return n, nil
}

// placedUnlisted counts the tasks of owner in placed that items, the
// owner's running tasks in the cache, do not hold yet: placed but not in
// the cache's count. One pass over each (a set of the listed keys, made
// only when owner has placed tasks), so a decision costs O(running +
// placed), not their product.
func placedUnlisted(placed map[types.NamespacedName]*placedTask, owner string, items []bashtaskv1alpha1.BashTask) int {
	var listed map[types.NamespacedName]struct{}
	n := 0
	for key, p := range placed {
		if p.owner != owner {
			continue
		}
		if listed == nil {
			listed = make(map[types.NamespacedName]struct{}, len(items))
			for i := range items {
				listed[types.NamespacedName{Namespace: items[i].Namespace, Name: items[i].Name}] = struct{}{}
			}
		}
		if _, ok := listed[key]; !ok {
			n++
		}
	}
	return n
}

// enter records bt as waiting for a slot on one of nodes (measured by fits
// when the record is missing or older than waiterRefresh). The caller
// holds f.mu.
func (f *fairShare) enter(bt *bashtaskv1alpha1.BashTask, now time.Time, fits func() map[string]bool) {
	if !f.enabled {
		return
	}
	key := client.ObjectKeyFromObject(bt)
	w := f.waiting[key]
	if w == nil {
		w = &waiter{
			contender: contender{key: key, created: bt.CreationTimestamp.Time, since: now},
			owner:     ptr.Deref(bt.Spec.Owner, ""),
		}
		f.wait(w)
	}
	if w.nodes == nil || now.Sub(w.measured) > waiterRefresh {
		w.nodes, w.measured = fits(), now
	}
}

// ownRunning returns the running count n of the waiter's owner as the turn
// order takes it: without the waiter itself when it is assigned (its
// dispatch is in the cache's count, though it runs nothing).
func (w *waiter) ownRunning(n int) int {
	if w.assigned && n > 0 {
		return n - 1
	}
	return n
}

// hold records that this process placed the task key on node: the slot is
// held until started and the owner's count raised until the cache shows
// the dispatch. The task no longer waits. The caller holds f.mu.
func (f *fairShare) hold(key types.NamespacedName, node, owner string, now time.Time) {
	p := &placedTask{node: node, owner: owner, since: now}
	if w := f.waiting[key]; w != nil {
		p.since = w.since
	}
	f.unwait(key)
	f.placed[key] = p
}

// refused records that node's agent refused bt's Start as full: bt, whose
// dispatch to node is written, gives up its held slot and waits in turn
// for one on node (an assigned waiter), keeping its place in the order.
// Without the turns it only gives up the slot, and retries on its own.
func (f *fairShare) refused(bt *bashtaskv1alpha1.BashTask, node string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := client.ObjectKeyFromObject(bt)
	since := now
	if p := f.placed[key]; p != nil && !p.since.IsZero() {
		since = p.since
	}
	delete(f.placed, key)
	if !f.enabled {
		return
	}
	w := f.waiting[key]
	if w == nil {
		w = &waiter{contender: contender{key: key, created: bt.CreationTimestamp.Time, since: since}, owner: ptr.Deref(bt.Spec.Owner, "")}
	} else {
		f.unwait(key) // its stream changes
	}
	w.nodes, w.measured, w.assigned = map[string]bool{node: true}, now, true
	f.wait(w)
}

// wait records w as waiting. The caller holds f.mu.
func (f *fairShare) wait(w *waiter) {
	f.waiting[w.key] = w
	f.queue.add(w)
}

// unwait removes key from the waiting tasks. The caller holds f.mu.
func (f *fairShare) unwait(key types.NamespacedName) {
	if w := f.waiting[key]; w != nil {
		delete(f.waiting, key)
		f.queue.remove(w)
	}
}

// assignedWaiting reports whether key is an assigned waiter (see refused).
// The caller holds f.mu.
func (f *fairShare) assignedWaiting(key types.NamespacedName) bool {
	w := f.waiting[key]
	return w != nil && w.assigned
}

// started notes that the agent's Start for key returned: the registry
// counts the task from now on.
func (f *fairShare) started(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.placed[key]; p != nil {
		p.started = true
	}
}

// drop gives up key's held slot and record: its dispatch was not written.
func (f *fairShare) drop(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.placed, key)
}

// leave removes key from the waiting tasks: its pass ended in something
// else than a wait for a slot.
func (f *fairShare) leave(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unwait(key)
}

// seen notes that the cache shows key dispatched or terminal: it no
// longer waits (unless it is an assigned waiter not yet terminal, see
// refused), and its owner's count comes from the cache.
func (f *fairShare) seen(key types.NamespacedName, terminal bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.waiting[key]; w != nil && (!w.assigned || terminal) {
		f.unwait(key)
	}
	if p := f.placed[key]; p != nil && p.started {
		delete(f.placed, key)
	}
}

// forget drops everything recorded of key, whose object is gone.
func (f *fairShare) forget(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unwait(key)
	delete(f.placed, key)
}

// notify wakes the tasks keys without blocking; a wake the channel has no
// room for is left to the task's retry.
func (f *fairShare) notify(keys []types.NamespacedName) {
	for _, k := range keys {
		bt := &bashtaskv1alpha1.BashTask{}
		bt.Namespace, bt.Name = k.Namespace, k.Name
		select {
		case f.wake <- event.TypedGenericEvent[*bashtaskv1alpha1.BashTask]{Object: bt}:
		default:
		}
	}
}

// next returns the waiting tasks whose turn it is for the free slots of
// node's agent (at least one, for the slot just freed), in turn order.
func (f *fairShare) next(ctx context.Context, c client.Reader, a agentpool.AgentState) ([]types.NamespacedName, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.enabled || len(f.waiting) == 0 {
		return nil, nil
	}
	held := 0
	for _, p := range f.placed {
		if p.node == a.Node && !p.started {
			held++
		}
	}
	slots := max(1, a.Capacity-a.Running-held)
	return f.first(ctx, &ownerCounts{reader: c, placed: f.placed, n: map[string]int{}}, a.Node, slots)
}

// first returns the first slots waiting tasks that fit node, in turn
// order. The caller holds f.mu.
func (f *fairShare) first(ctx context.Context, counts *ownerCounts, node string, slots int) ([]types.NamespacedName, error) {
	var out []types.NamespacedName
	fits := func(w *waiter) bool { return w.nodes[node] }
	err := f.queue.inTurn(ctx, counts, fits, func(c contender, _ *waiter) bool {
		out = append(out, c.key)
		return len(out) < slots
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
