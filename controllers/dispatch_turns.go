package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// takeTurn places bt in its turn: on an agent with a slot that no task
// waiting ahead of it claims (see fairShare.views), holding that slot
// until the agent's Start returns. When the only free slots it fits are
// claimed, it waits with ReasonFairShare and wakes the tasks that claimed
// them; when it fits an agent that has no slot, it waits with the
// placement's reason. Either way it enters the turns; any other outcome
// leaves them. Decisions are serialized by the turns' lock, so that
// concurrent workers neither hand out one slot twice nor pass over a
// task whose turn it is.
func (r *BashTaskReconciler) takeTurn(ctx context.Context, bt *bashtaskv1alpha1.BashTask, target *workspaceTarget, now time.Time) (placement, error) {
	f := r.fair
	f.mu.Lock()
	defer f.mu.Unlock()
	v, err := f.views(ctx, r.client, r.agents, bt, now)
	if err != nil {
		return placement{}, err
	}
	key := client.ObjectKeyFromObject(bt)
	pl := r.placeIn(ctx, bt, target, v.claimed)
	if pl.agent != nil {
		f.hold(key, pl.agent.Node, ptr.Deref(bt.Spec.Owner, ""), now)
		return pl, nil
	}
	fits := func() map[string]bool { return r.fits(ctx, bt, target) }
	if len(v.ahead) > 0 && r.placeIn(ctx, bt, target, v.held).agent != nil {
		f.enter(bt, now, fits)
		f.notify(v.ahead)
		return placement{reason: ReasonFairShare, why: turnMessage(bt)}, nil
	}
	if pl.reason == ReasonNoAgent && pl.invalid == "" {
		f.enter(bt, now, fits)
		if w := f.waiting[key]; w != nil && len(w.nodes) == 0 {
			f.unwait(key) // it fits no agent: no slot helps
		}
		return pl, nil
	}
	f.unwait(key)
	return pl, nil
}

// startTurn decides whether bt, dispatched to node but not started, may
// ask its agent to Start now. A task whose Start the agent refused as full
// (an assigned waiter, see fairShare.refused) waits until its node has a
// slot that no task ahead of it claims, so that a refused task never
// retries its way past the turns; it then holds that slot until Start
// returns. Any other such task (the controller stopped between the
// write-ahead and Start, or Start's reply was lost) starts at once: its
// slot was granted when it was placed.
func (r *BashTaskReconciler) startTurn(ctx context.Context, bt *bashtaskv1alpha1.BashTask, node string, now time.Time) (bool, error) {
	f := r.fair
	f.mu.Lock()
	defer f.mu.Unlock()
	key := client.ObjectKeyFromObject(bt)
	if !f.assignedWaiting(key) {
		return true, nil
	}
	v, err := f.views(ctx, r.client, r.agents, bt, now)
	if err != nil {
		return false, err
	}
	if a := v.claimed.Agent(node); a.Capacity > 0 && a.Running >= a.Capacity {
		f.notify(v.ahead)
		return false, nil
	}
	f.hold(key, node, ptr.Deref(bt.Spec.Owner, ""), now)
	return true, nil
}

// turnMessage is the Scheduled message of a task that lost its turn.
func turnMessage(bt *bashtaskv1alpha1.BashTask) string {
	who := "tasks without an owner"
	if o := ptr.Deref(bt.Spec.Owner, ""); o != "" {
		who = fmt.Sprintf("owner %q", o)
	}
	return fmt.Sprintf("waiting its turn: an agent the task fits has a free slot, but tasks waiting for it come first (their owners run fewer tasks than %s, or they waited longer; --fair-share); it is woken when its turn comes", who)
}

// placeIn places bt as agents shows the agents: on its workspace's node,
// or by its placement request.
func (r *BashTaskReconciler) placeIn(ctx context.Context, bt *bashtaskv1alpha1.BashTask, target *workspaceTarget, agents agentLister) placement {
	if target != nil {
		return workspaceAgent(agents, target)
	}
	return placeAgent(ctx, r.client, agents, r.placementRequest(bt))
}

// fits returns the agents bt could be placed on were they not full: its
// workspace's node when that agent is ready, else each agent that
// placement takes when capacity is left aside. It reads each candidate's
// Node from the cache, so it runs when a task starts to wait and then
// every waiterRefresh, not on every pass.
func (r *BashTaskReconciler) fits(ctx context.Context, bt *bashtaskv1alpha1.BashTask, target *workspaceTarget) map[string]bool {
	out := map[string]bool{}
	if target != nil {
		if r.agents.Agent(target.node).Ready {
			out[target.node] = true
		}
		return out
	}
	p := r.placementRequest(bt)
	p.anyCapacity = true
	for _, a := range r.agents.Agents() {
		if p.nodeName != "" && a.Node != p.nodeName {
			continue
		}
		one := p
		one.nodeName = a.Node
		if placeAgent(ctx, r.client, r.agents, one).agent != nil {
			out[a.Node] = true
		}
	}
	return out
}

// indexRunningOwner registers IndexRunningOwner.
func indexRunningOwner(mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &bashtaskv1alpha1.BashTask{}, IndexRunningOwner,
		func(o client.Object) []string {
			bt := o.(*bashtaskv1alpha1.BashTask)
			if !isDispatched(bt) || isTerminal(bt) {
				return nil
			}
			return []string{ptr.Deref(bt.Spec.Owner, "")}
		})
	if err != nil {
		return fmt.Errorf("indexing BashTasks by %s: %w", IndexRunningOwner, err)
	}
	return nil
}

// slotFreed passes the events of a task that gave up its agent's slot:
// one that became terminal on an agent, and one deleted while on an agent
// and not terminal (its finalizer removed by hand).
func slotFreed() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, oldOK := e.ObjectOld.(*bashtaskv1alpha1.BashTask)
			bt, ok := e.ObjectNew.(*bashtaskv1alpha1.BashTask)
			return oldOK && ok && !isTerminal(old) && isTerminal(bt) && isDispatched(bt)
		},
		DeleteFunc: func(e event.DeleteEvent) bool {
			bt, ok := e.Object.(*bashtaskv1alpha1.BashTask)
			return ok && isDispatched(bt) && !isTerminal(bt)
		},
	}
}

// nextInTurn maps a task that gave up its agent's slot (see slotFreed) to
// the waiting tasks whose turn it is for that agent's free slots, so that
// they are placed at once rather than at their next retry.
func (r *BashTaskReconciler) nextInTurn(ctx context.Context, o client.Object) []reconcile.Request {
	bt, ok := o.(*bashtaskv1alpha1.BashTask)
	if !ok {
		return nil
	}
	keys, err := r.fair.next(ctx, r.client, r.agents.Agent(nodeOf(&bt.Status)))
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Finding the next waiting tasks; they retry on their own", "node", nodeOf(&bt.Status))
		return nil
	}
	return requestsFor(keys)
}

// requestsFor turns keys into reconcile requests.
func requestsFor(keys []types.NamespacedName) []reconcile.Request {
	out := make([]reconcile.Request, len(keys))
	for i, k := range keys {
		out[i] = reconcile.Request{NamespacedName: k}
	}
	return out
}
