package agent

import (
	"context"
	"fmt"
	"slices"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// The agent's stop with its workspaces moved (docs/workspaces.md, "Agent
// shutdown"). A workspace lives in the node's state directory; an agent
// asked to stop (SIGTERM: a DaemonSet rollout, a node shutdown) may not
// come back on this node, so before it stops it drains: it says so on the
// Watch stream (Readiness.draining), takes no new task or workspace, stops
// its running tasks, and waits while the controller snapshots and
// releases each workspace that may move (the controller's drained, as for
// a cordoned node). The agent takes no snapshot of its own: the controller
// restores only from the snapshot recorded in the workspace's status, so
// an object it was never told of would restore nothing.

// DefaultDrainUnwatchedLimit is Config.DrainUnwatchedLimit's default: long
// enough for a controller that restarts, or whose stream broke, to watch
// again, short enough that an agent whose controller is gone (stopped
// before it, as a local cluster goes down, or on the same node as it
// shuts down) does not wait its whole --shutdown-workspace-timeout.
const DefaultDrainUnwatchedLimit = 10 * time.Second

// drainPoll is how often a drain looks whether a controller watches.
const drainPoll = 250 * time.Millisecond

// DrainResult says what a [Server.Drain] did.
type DrainResult struct {
	// StoppedTasks counts the running tasks the drain stopped; they end
	// AgentRestarted.
	StoppedTasks int
	// Movable counts the workspaces that could move when the drain began:
	// held at the tenant level with a bucket the nodes share (the
	// "snapshots" capability) and not pinned to this node.
	Movable int
	// Left counts those still held when the drain ended: the controller
	// did not release them within the drain's time, or no controller
	// watched the agent for Config.DrainUnwatchedLimit. They stay in the
	// state directory, where the agent's next start on this node takes
	// them up.
	Left int
	// Unwatched is set when the drain ended because no controller watched
	// the agent.
	Unwatched bool
	// Took is how long the drain lasted.
	Took time.Duration
}

// Drain is the first step of the agent's stop, before Run's context ends:
// the agent reports itself draining and not ready on every Watch stream,
// refuses new tasks and new workspaces (UNAVAILABLE) while it keeps
// serving Watch, the workspace calls and the task reads, stops its
// running tasks (TERM, grace, KILL; they end AgentRestarted, as at any
// shutdown), and waits until it holds no workspace that may move, ctx
// ends, or no Watch stream was open for Config.DrainUnwatchedLimit. A workspace may move when the agent has the "snapshots"
// capability and the workspace is not pinned (WorkspaceSpec.pinned); the
// controller moves each once its tasks ended (snapshot, then
// DeleteWorkspace). Drain returns at once when nothing may move. It is
// meant to be called once; a second call only waits again.
func (s *Server) Drain(ctx context.Context) DrainResult {
	began := time.Now()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return DrainResult{}
	}
	s.draining = true
	res := DrainResult{StoppedTasks: s.stopRunningLocked(), Movable: s.ws.movableLocked()}
	s.updateHealthLocked()
	s.broadcastLocked(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_Agent{Agent: s.agentInfoLocked()}})
	s.mu.Unlock()
	s.log.Info("draining: moving workspaces off this node before the agent stops",
		"stoppedTasks", res.StoppedTasks, "workspaces", res.Movable)

	res.Left, res.Unwatched = s.waitMoved(ctx, res.Movable)
	res.Took = time.Since(began)
	if res.Left > 0 {
		s.log.Warn("drain ended with workspaces still on this node: they stay in the state directory for the agent's next start here",
			"workspaces", res.Left, "moved", res.Movable-res.Left, "noController", res.Unwatched, "took", res.Took.Round(time.Millisecond))
	} else {
		s.log.Info("drained", "moved", res.Movable, "took", res.Took.Round(time.Millisecond))
	}
	return res
}

// waitMoved waits until the agent holds no workspace that may move, ctx
// ends, or no Watch stream was open for Config.DrainUnwatchedLimit (looked
// at every drainPoll), and returns how many it still holds and whether it
// gave up for want of a controller. last is the count the watchers saw;
// each change goes to them, since it is in the readiness problem.
func (s *Server) waitMoved(ctx context.Context, last int) (left int, unwatched bool) {
	poll := time.NewTicker(drainPoll)
	defer poll.Stop()
	var since time.Time // when the agent was last seen without a watcher; zero while watched
	for {
		s.mu.Lock()
		left, changed, watched := s.ws.movableLocked(), s.ws.changed, len(s.watchers) > 0
		if left != last {
			last = left
			s.broadcastLocked(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_Agent{Agent: s.agentInfoLocked()}})
		}
		s.mu.Unlock()
		switch {
		case left == 0:
			return 0, false
		case watched:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= s.cfg.DrainUnwatchedLimit:
			return left, true
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-ctx.Done():
			return left, false
		}
	}
}

// updateHealthLocked sets the gRPC health service's status from the
// readiness: SERVING only while the agent is ready (and not draining).
func (s *Server) updateHealthLocked() {
	st := healthpb.HealthCheckResponse_SERVING
	if ready, _ := s.readinessLocked(); !ready {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// stopRunningLocked cancels every running task for the agent's shutdown
// (not the user's cancel: they end AgentRestarted) and returns how many.
// A task still being started is cancelled by Start once it exists.
func (s *Server) stopRunningLocked() int {
	n := 0
	for _, e := range s.tasks {
		if e.task != nil && e.status.State == agentv1.TaskState_TASK_STATE_RUNNING {
			e.stopByAgent = !e.cancelled
			e.task.Cancel()
			n++
		}
	}
	return n
}

// readinessLocked is the readiness the agent reports: its problems, and
// while it drains one more, which says how many workspaces it still moves.
func (s *Server) readinessLocked() (ready bool, problems []string) {
	problems = slices.Clone(s.problems)
	if s.draining {
		msg := "shutting down"
		if n := s.ws.movableLocked(); n > 0 {
			msg = fmt.Sprintf("shutting down: moving %d workspaces to other nodes", n)
		}
		problems = append(problems, msg)
	}
	return len(problems) == 0, problems
}

// movableLocked counts the workspaces the controller moves off a draining
// agent: with the "snapshots" capability, those not pinned to the node,
// made (or being made, or being deleted) and not gone. One that could not
// be taken up cannot be snapshotted and stays. Called with Server.mu held.
func (ws *workspaces) movableLocked() int {
	if !slices.Contains(ws.capabilitiesLocked(), "snapshots") {
		return 0
	}
	n := 0
	for _, w := range ws.byUID {
		if !w.gone && !w.rec.Pinned && (w.ex != nil || w.busy != nil) {
			n++
		}
	}
	return n
}

// changedLocked wakes whoever waits for the table of workspaces to
// change (a draining Server): one was removed, or failed to be made.
func (ws *workspaces) changedLocked() {
	close(ws.changed)
	ws.changed = make(chan struct{})
}
