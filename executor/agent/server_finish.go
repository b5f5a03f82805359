package agent

import (
	"context"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// waitTask waits for a task's end and records it.
func (s *Server) waitTask(e *entry) {
	defer s.tasksWG.Done()
	res, _ := e.task.Wait(context.Background()) // cannot fail without a deadline
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	s.metrics.Running.Set(float64(s.running))
	if e.stopByAgent && res.Reason == executor.ReasonCancelled {
		// Not the user's cancel: the agent stopped it to shut down.
		res.Reason = ReasonAgentRestarted
		res.Message = "the agent shut down while the task ran; the task was stopped"
	}
	s.metrics.LeftoverKilled.Add(float64(res.LeftoverProcesses))
	s.metrics.OutputBytes.WithLabelValues("stdout").Add(float64(res.Stdout.TotalBytes))
	s.metrics.OutputBytes.WithLabelValues("stderr").Add(float64(res.Stderr.TotalBytes))
	s.finishLocked(e, res)
}

// finishLocked records a task's result, decides its uploads and sends the
// terminal event at once: uploads never hold it back.
func (s *Server) finishLocked(e *entry, res executor.Result) {
	uid := e.status.GetRef().GetUid()
	applyResult(e.status, res)
	e.setKeptLocked()
	applyStdin(e.status, e.task)
	s.ws.taskEndedLocked(uid, e.status.GetRef().GetName(), res)
	e.releaseImage() // the task's root is unmounted: the image may go
	s.planUploadsLocked(e, false)
	e.rec.State = stateFinished
	if !res.CleanupFailed {
		// The executor's task is over only once its cgroup is empty and
		// its fresh working directory removed; its /tmp and /dev/shm died
		// with its mount namespace.
		s.releaseLeaseLocked(e)
	} else if e.rec.Process.TaskUID != nil {
		s.log.Error("keeping the task's UID leased: its cgroup or working directory is left", "uid", uid, "taskUID", *e.rec.Process.TaskUID)
	}
	if err := s.store.write(uid, e.rec, e.status); err != nil {
		s.log.Error("recording finished task", "uid", uid, "err", err)
	}
	s.metrics.Finished.WithLabelValues(e.status.Reason).Inc()
	s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_FINISHED, e.status))
	s.log.Info("task finished", "uid", uid, "reason", e.status.Reason, "exitCode", e.status.ExitCode)
	if e.pendingUploads() > 0 {
		s.kickUploader()
	}
}

// releaseLeaseLocked returns the task's UID to the pool; the record is
// written by the caller.
func (s *Server) releaseLeaseLocked(e *entry) {
	p := &e.rec.Process
	if p.TaskUID == nil || p.LeaseReleased {
		return
	}
	p.LeaseReleased = true
	if s.leases != nil && s.leases.held[*p.TaskUID] == e.status.GetRef().GetUid() {
		s.leases.release(*p.TaskUID)
	}
}
