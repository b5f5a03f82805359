package agent

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// Forget implements the Forget RPC.
func (s *Server) Forget(_ context.Context, req *agentv1.ForgetRequest) (*agentv1.ForgetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	uid := req.GetUid()
	e, ok := s.tasks[uid]
	if !ok {
		return &agentv1.ForgetResponse{Forgotten: true}, nil
	}
	if e.status.State != agentv1.TaskState_TASK_STATE_FINISHED {
		return nil, status.Errorf(codes.FailedPrecondition, "task %s is still running", uid)
	}
	e.status.ForgetRequested = true
	if e.pendingUploads() > 0 {
		if err := s.store.write(uid, e.rec, e.status); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &agentv1.ForgetResponse{Forgotten: false}, nil
	}
	if err := s.forgetLocked(e); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &agentv1.ForgetResponse{Forgotten: true}, nil
}

// forgetLocked deletes a finished task whose uploads are done.
func (s *Server) forgetLocked(e *entry) error {
	uid := e.status.GetRef().GetUid()
	if err := s.store.remove(uid); err != nil {
		return err
	}
	delete(s.tasks, uid)
	s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_FORGOTTEN, e.status))
	s.log.Info("task forgotten", "uid", uid)
	return nil
}
