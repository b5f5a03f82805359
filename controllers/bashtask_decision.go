package controllers

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// taskDecision is what one phase of a BashTask pass decided. The phase has
// changed bt.Status in memory and made the agent calls it needed (a Start,
// a Cancel, a read); Reconcile writes the status once, when write names a
// kind, and only after that write succeeded sends the events and runs the
// steps that must follow a recorded status.
type taskDecision struct {
	// write labels the pass's status write in metrics ("pending",
	// "terminal", "pull", "running", "progress", "observed", "upload"); "" leaves
	// the stored status as it is and drops the phase's in-memory changes:
	// a Running status held back by --running-status-delay, progress
	// within --progress-interval, a pass that only waits.
	write string
	// result is the pass's requeue.
	result reconcile.Result
	// events are sent after the status write succeeded, never before: an
	// event must not announce a status the API does not show (a write
	// refused by a conflict is computed again by the next pass, which
	// would send the event a second time).
	events []taskEvent
	// progress stamps the write's time for the --progress-interval
	// throttle.
	progress bool
	// finished observes the task's end in metrics once it is recorded.
	finished bool
	// finish is what a terminal task needs once its status is recorded;
	// nil for none.
	finish *finishPlan
}

// taskEvent is one event a pass owes.
type taskEvent struct {
	typ, reason, action, note string
}

// specGate decides for a task not yet dispatched whose spec says to
// cancel it (it ends Cancelled) or to hold it (Suspended); nil when
// neither.
func specGate(bt *bashtaskv1alpha1.BashTask, now time.Time) *taskDecision {
	switch {
	case ptr.Deref(bt.Spec.CancelRequested, false):
		return endDecision(bt, bashtaskv1alpha1.ReasonCancelled, "cancelled before it was dispatched", now)
	case ptr.Deref(bt.Spec.Suspend, false):
		setPending(bt, ReasonSuspended, "spec.suspend is true; the task is not dispatched")
		return &taskDecision{write: "pending"}
	}
	return nil
}

// endDecision ends the task with reason and message at now: the pass
// writes the terminal status.
func endDecision(bt *bashtaskv1alpha1.BashTask, reason bashtaskv1alpha1.Reason, message string, now time.Time) *taskDecision {
	setTerminal(bt, reason, message, now)
	return &taskDecision{write: "terminal"}
}

// waitDecision keeps the task pending for reason (Scheduled=False) and
// comes back after retry.
func waitDecision(bt *bashtaskv1alpha1.BashTask, reason, message string, retry time.Duration) *taskDecision {
	setPending(bt, reason, message)
	return &taskDecision{write: "pending", result: reconcile.Result{RequeueAfter: retry}}
}

// workspaceGate decides for a task whose workspace c says it cannot run
// there now: it ends (c.end) or waits (c.wait); nil when c has a target.
// The workspace's changes wake a waiting task (see
// tasksWaitingForWorkspace); its requeue is only the safety net.
func workspaceGate(bt *bashtaskv1alpha1.BashTask, c workspaceCheck, now time.Time) *taskDecision {
	switch {
	case c.end != "":
		return endDecision(bt, c.end, c.message, now)
	case c.target == nil:
		return waitDecision(bt, c.wait, c.message, runningResync)
	}
	return nil
}

// resolveGate decides on the error of resolving the task's references: a
// missing reference is waited for, with a warning event when the wait is
// new or its reason changed (one per change, not one per retry), and an
// invalid value ends the task. nil for no error or any other error, which
// the caller returns.
func resolveGate(bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus, err error, now time.Time, retry time.Duration) *taskDecision {
	var missing *missingReferenceError
	var invalid *invalidValueError
	switch {
	case errors.As(err, &missing):
		setPending(bt, ReasonMissingReference, missing.Error())
		d := &taskDecision{write: "pending", result: reconcile.Result{RequeueAfter: retry}}
		if conditionChanged(old, bt, bashtaskv1alpha1.ConditionScheduled) {
			d.events = []taskEvent{{corev1.EventTypeWarning, ReasonMissingReference, "Resolve", missing.Error()}}
		}
		return d
	case errors.As(err, &invalid):
		return endDecision(bt, bashtaskv1alpha1.ReasonInvalidSpec, invalid.Error(), now)
	}
	return nil
}

// placementGate decides for a task no agent was chosen for: it ends
// InvalidSpec when every candidate refuses its network (a policy of the
// nodes, not a wait), else waits with the placement's reason. nil when
// pl has an agent.
func placementGate(bt *bashtaskv1alpha1.BashTask, pl placement, now time.Time, retry time.Duration) *taskDecision {
	switch {
	case pl.invalid != "":
		return endDecision(bt, bashtaskv1alpha1.ReasonInvalidSpec, pl.invalid, now)
	case pl.agent == nil:
		return waitDecision(bt, pl.reason, pl.why, retry)
	}
	return nil
}

// unreachableDecision decides for a dispatched task whose agent has no
// working stream: once it was unreachable for lostAfter, on the
// controller's monotonic clock, the task ends AgentLost, its status saying
// which output survives; until then the pass waits for the rest of that
// time.
func unreachableDecision(bt *bashtaskv1alpha1.BashTask, agent agentpool.AgentState, lostAfter time.Duration, now time.Time) taskDecision {
	if agent.UnreachableFor < lostAfter {
		return taskDecision{result: reconcile.Result{RequeueAfter: lostAfter - agent.UnreachableFor}}
	}
	node := nodeOf(&bt.Status)
	lost := markOutputLost(&bt.Status)
	setTerminal(bt, bashtaskv1alpha1.ReasonAgentLost,
		fmt.Sprintf("the agent on node %s was unreachable for %s (--agent-lost-after %s)%s", node, agent.UnreachableFor.Round(time.Second), lostAfter, lost), now)
	return taskDecision{write: "terminal", events: []taskEvent{
		{corev1.EventTypeWarning, string(bashtaskv1alpha1.ReasonAgentLost), "Follow", fmt.Sprintf("Agent on node %s lost", node)},
	}}
}

// reportTimes is this process's record of a task's timing, for
// reportDecision.
type reportTimes struct {
	now time.Time
	// started is when this process dispatched the task; dispatched says
	// whether it did (after a restart it did not).
	started    time.Time
	dispatched bool
	// lastProgress is when this process last wrote the task's status while
	// it ran; progressWritten says whether it did.
	lastProgress    time.Time
	progressWritten bool
}

// reportDecision decides on the status an agent's report produced in bt
// (old is the status stored). A terminal status is written, with an
// event for every failure and for a success that was reported Running
// (and so got a Started event): a Normal event per short successful task
// would be one more API write per task, repeating its status. A running
// task's first Running write waits for runningDelay after dispatch, as
// most tasks are short and their terminal status replaces it; after it,
// progress (tails, byte counts) is written at most once per
// progressInterval.
func reportDecision(bt *bashtaskv1alpha1.BashTask, old *bashtaskv1alpha1.BashTaskStatus, t reportTimes, runningDelay, progressInterval time.Duration) taskDecision {
	if isTerminal(bt) {
		d := taskDecision{write: "terminal", finished: true}
		if reasonOf(&bt.Status) != bashtaskv1alpha1.ReasonSucceeded || phaseOf(old) == bashtaskv1alpha1.PhaseRunning {
			d.events = []taskEvent{{eventType(bt), string(reasonOf(&bt.Status)), "Finish", finishNote(bt)}}
		}
		return d
	}
	wasRunning := phaseOf(old) == bashtaskv1alpha1.PhaseRunning
	kind := "running"
	if !wasRunning {
		if wait := runningDelay - t.now.Sub(t.started); t.dispatched && wait > 0 {
			return taskDecision{result: reconcile.Result{RequeueAfter: wait}}
		}
	} else {
		kind = "progress"
		if t.progressWritten && t.now.Sub(t.lastProgress) < progressInterval {
			return taskDecision{result: reconcile.Result{RequeueAfter: progressInterval - t.now.Sub(t.lastProgress)}}
		}
	}
	// Agent events drive running tasks; the requeue is the safety net
	// that re-derives their state should an event ever be missed.
	resync := reconcile.Result{RequeueAfter: runningResync}
	if equality.Semantic.DeepEqual(old, &bt.Status) {
		return taskDecision{result: resync}
	}
	d := taskDecision{write: kind, progress: true, result: resync}
	if !wasRunning && phaseOf(&bt.Status) == bashtaskv1alpha1.PhaseRunning {
		d.events = []taskEvent{{corev1.EventTypeNormal, ReasonStarted, "Start", "Started on node " + nodeOf(&bt.Status)}}
	}
	return d
}

// finishAgent is what a finished task needs of its node's agent.
type finishAgent int

const (
	// finishNone asks nothing: the agent does not hold the task, is not
	// connected, or still uploads its output.
	finishNone finishAgent = iota
	// finishCancel stops a command the agent still runs although the task
	// is recorded terminal: its node was declared lost while unreachable
	// (AgentLost) and is back. The recorded outcome stands; the agent's
	// report of the command's end brings the task back to be forgotten.
	finishCancel
	// finishForget lets the agent drop its copy: the terminal status and
	// the object references are recorded. Not earlier: an agent that
	// forgot a task can no longer tell where its output went.
	finishForget
)

// finishPlan is what a finished task needs once its status is recorded,
// in this order: the agent's step; then, unless that was a Cancel, the
// finalizer's removal for a deleted task, else the TTL's deletion.
type finishPlan struct {
	agent finishAgent
	// removeFinalizer releases a deleted task. The finalizer stays on a
	// finished task until it is deleted: removing it earlier would cost
	// every task one more write.
	removeFinalizer bool
	// ttlDue says the task's TTL of ttl seconds passed: it is deleted,
	// unless a GitOps tool manages it (see keepManaged).
	ttlDue bool
	ttl    int32
}

// finishState is what planFinish needs to know besides the task.
type finishState struct {
	// held: the connected agent still reports the task and no upload is
	// pending; running: it reports the command running; uploading: the
	// connected agent still uploads its output (OutputUploaded False).
	held, running, uploading bool
	// defaultTTL is --default-ttl-seconds-after-finished, nil for none.
	defaultTTL *int32
	now        time.Time
}

// planFinish plans what a finished task needs once its status is recorded
// (see finishPlan), and how long until its TTL is due, 0 for no wait.
func planFinish(bt *bashtaskv1alpha1.BashTask, s finishState) (finishPlan, time.Duration) {
	var p finishPlan
	if s.held {
		if s.running {
			p.agent = finishCancel
			return p, 0
		}
		p.agent = finishForget
	}
	if !bt.DeletionTimestamp.IsZero() {
		if s.uploading && s.now.Sub(bt.DeletionTimestamp.Time) < RecordGiveUpAfter {
			// The status, and the record kept of it, must say where the
			// output went: the upload's report ends the wait.
			return p, uploadWait
		}
		p.removeFinalizer = true
		return p, 0
	}
	ttl := bt.Spec.TTLSecondsAfterFinished
	if ttl == nil {
		ttl = s.defaultTTL
	}
	if ttl == nil || bt.Status.CompletionTime == nil {
		return p, 0
	}
	due := bt.Status.CompletionTime.Add(time.Duration(*ttl) * time.Second)
	if wait := due.Sub(s.now); wait > 0 {
		return p, wait
	}
	if s.uploading {
		return p, uploadWait
	}
	p.ttlDue, p.ttl = true, *ttl
	return p, 0
}

// uploadWait is how soon a finished task whose deletion or TTL waits for
// its uploads is looked at again; the agent's report of the upload
// normally comes first.
const uploadWait = 5 * time.Second
