package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// recoverTasks loads every record of the state directory. Finished tasks
// are kept as they were (their pending uploads restart); tasks an earlier
// incarnation was running are stopped and finished with reason
// AgentRestarted. An unreadable record is logged and its files are left
// alone for an operator to look at.
func (s *Server) recoverTasks() {
	if dir := s.cfg.Executor.DiskImageDir; dir != "" {
		// The earlier incarnation's working directory file systems:
		// unmounted first, so that removing a working directory below
		// removes an empty mount point and never walks what a task wrote.
		if err := executor.SweepDiskImages(dir); err != nil {
			s.log.Error("removing the working directory file systems of an earlier incarnation", "dir", dir, "err", err)
		}
	}
	uids, loaded := s.store.records()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, uid := range uids {
		rec, st, err := loaded[uid].rec, loaded[uid].status, loaded[uid].err
		if err != nil {
			s.log.Error("recovering task: unreadable record; leaving it and the task's files", "uid", uid, "err", err)
			continue
		}
		e := &entry{rec: rec, status: st}
		if p := rec.Process; p.TaskUID != nil && !p.LeaseReleased {
			// Held until recoverRunning finds the task's processes and
			// files gone; a lease whose release is unknown stays held.
			if s.leases != nil {
				s.leases.hold(*p.TaskUID, uid)
			} else {
				s.log.Warn("recovering task: it holds a task UID but this agent leases none", "uid", uid, "taskUID", *p.TaskUID)
			}
		}
		if rec.State != stateFinished {
			s.recoverRunning(e)
		} else {
			for i := range e.uploads {
				if sp := e.stream(i).GetSpill(); sp.GetUploadState() == agentv1.UploadState_UPLOAD_STATE_PENDING {
					e.uploads[i] = &uploadJob{next: time.Now()}
				}
			}
		}
		s.tasks[uid] = e
		if st.ForgetRequested && e.pendingUploads() == 0 {
			if err := s.forgetLocked(e); err != nil {
				s.log.Error("forgetting recovered task", "uid", uid, "err", err)
			}
		}
	}
	s.updateBacklogLocked()
	if len(s.tasks) > 0 {
		s.log.Info("recovered tasks from the state directory", "tasks", len(s.tasks))
	}
}

// recoverRunning stops what is left of a task an earlier incarnation ran
// and finishes it with reason AgentRestarted and the output read so far.
func (s *Server) recoverRunning(e *entry) {
	uid := e.status.GetRef().GetUid()
	killed, err := stopLeftovers(e.rec.Process, EnvUID+"="+uid)
	if err != nil {
		s.log.Error("stopping processes of an earlier incarnation", "uid", uid, "err", err)
	}
	s.metrics.LeftoverKilled.Add(float64(killed))
	clean := err == nil
	if dir := e.rec.Process.WorkDir; dir != "" {
		// The executor removes a fresh working directory when the task
		// ends; the earlier incarnation died before it could.
		if rerr := os.RemoveAll(dir); rerr != nil {
			s.log.Error("removing the working directory of an earlier incarnation's task", "uid", uid, "dir", dir, "err", rerr)
			clean = false
		}
	}
	if clean {
		s.releaseLeaseLocked(e)
	}

	st := e.status
	st.State = agentv1.TaskState_TASK_STATE_FINISHED
	st.Reason = ReasonAgentRestarted
	st.Message = fmt.Sprintf("the agent restarted while the task ran (incarnation %s); %d leftover processes were stopped; the output read before the restart is kept",
		st.GetIncarnationId(), killed)
	if err != nil {
		st.Message += fmt.Sprintf("; stopping them failed: %v", err)
	}
	st.ExitCode = -1
	st.Signal = ""
	st.LeftoverProcesses = int32(killed)
	st.CompletionTime = timestamppb.Now()
	for i, name := range streamNames {
		ss, rerr := recoverStream(filepath.Join(s.store.outputDir(uid), name), e.rec.TailBytes, e.rec.SpillLimitBytes, e.rec.LastTotals[i])
		if rerr != nil {
			s.log.Error("recovering output", "uid", uid, "stream", name, "err", rerr)
			ss = &agentv1.StreamStatus{TotalBytes: e.rec.LastTotals[i]}
		}
		if i == 0 {
			st.Stdout = ss
		} else {
			st.Stderr = ss
		}
		s.metrics.OutputBytes.WithLabelValues(name).Add(float64(ss.TotalBytes))
	}
	s.planUploadsLocked(e, true)
	e.rec.State = stateFinished
	if err := s.store.write(uid, e.rec, st); err != nil {
		s.log.Error("recording recovered task", "uid", uid, "err", err)
	}
	s.metrics.Finished.WithLabelValues(ReasonAgentRestarted).Inc()
	s.log.Info("task of an earlier incarnation finished", "uid", uid, "reason", ReasonAgentRestarted,
		"leftoverKilled", killed, "earlierIncarnation", st.GetIncarnationId())
}
