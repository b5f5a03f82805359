package agent

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

type watcher struct {
	ch chan *agentv1.WatchResponse
}

// Watch implements the Watch RPC.
func (s *Server) Watch(req *agentv1.WatchRequest, stream agentv1.Executor_WatchServer) error {
	release, err := s.admitFence(stream.Context(), "Watch", req.GetFence())
	if err != nil {
		return err
	}
	// The stream only reports: it does not hold the fence while it lasts.
	release()
	// It holds the node's lease on its workspaces while it lasts.
	defer s.holdLease(req.GetWorkspaceLeaseMs())()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "agent is shutting down")
	}
	// Subscribing and taking the current state under one lock means no
	// event falls between the two.
	w := &watcher{ch: make(chan *agentv1.WatchResponse, s.cfg.WatchBuffer)}
	s.watchers[w] = struct{}{}
	first := []*agentv1.WatchResponse{{Event: &agentv1.WatchResponse_Agent{Agent: s.agentInfoLocked()}}}
	for _, uid := range s.sortedUIDsLocked() {
		e := s.tasks[uid]
		s.refreshLocked(e)
		first = append(first, taskEvent(agentv1.EventType_EVENT_TYPE_CURRENT, e.status))
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
	}()

	for _, m := range first {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-s.stopCh:
			// Run closes stopCh after the tasks the shutdown stopped have
			// queued their terminal events; send those before ending, or
			// select's random choice would drop them half the time.
			for {
				select {
				case m, ok := <-w.ch:
					if !ok {
						return status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; watch again", s.cfg.WatchBuffer)
					}
					if err := stream.Send(m); err != nil {
						return err
					}
				default:
					return status.Error(codes.Unavailable, "agent is shutting down")
				}
			}
		case m, ok := <-w.ch:
			if !ok {
				return status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; watch again", s.cfg.WatchBuffer)
			}
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// broadcastLocked queues m for every watcher; a watcher whose buffer is full
// is dropped (its channel closed) rather than blocking the agent.
func (s *Server) broadcastLocked(m *agentv1.WatchResponse) {
	for w := range s.watchers {
		select {
		case w.ch <- m:
		default:
			close(w.ch)
			delete(s.watchers, w)
		}
	}
}

// progressLoop sends a progress event for each running task whose output
// changed since its last event, at most once per ProgressInterval.
func (s *Server) progressLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for _, uid := range s.sortedUIDsLocked() {
			e := s.tasks[uid]
			if e.task == nil || e.status.State != agentv1.TaskState_TASK_STATE_RUNNING {
				continue
			}
			snap := e.task.Snapshot()
			totals := [2]int64{snap.Stdout.TotalBytes, snap.Stderr.TotalBytes}
			kept := [2]int64{e.keptLocked(0), e.keptLocked(1)}
			if !stdinChanged(e.status, e.task) && totals == e.rec.LastTotals && kept == e.sentKept {
				continue
			}
			applySnapshot(e.status, snap)
			e.setKeptLocked()
			e.rec.LastTotals, e.sentKept = totals, kept
			if err := s.store.write(uid, e.rec, e.status); err != nil {
				s.log.Error("recording progress", "uid", uid, "err", err)
			}
			s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_PROGRESS, e.status))
		}
		s.mu.Unlock()
	}
}

func taskEvent(t agentv1.EventType, st *agentv1.TaskStatus) *agentv1.WatchResponse {
	return &agentv1.WatchResponse{Event: &agentv1.WatchResponse_Task{Task: &agentv1.TaskEvent{Type: t, Status: clone(st)}}}
}
