package agent

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// execStdinStream translates TaskSpec.stdin_stream for the executor, which
// checks its bounds (a bad one ends the task StartFailed naming it).
func execStdinStream(s *agentv1.StdinStream) *executor.StdinStream {
	if s == nil {
		return nil
	}
	var idle time.Duration
	if d := s.GetIdleTimeout(); d != nil {
		idle = d.AsDuration()
	}
	return &executor.StdinStream{IdleTimeout: idle}
}

var stdinReasons = map[executor.StdinCloseReason]agentv1.StdinCloseReason{
	executor.StdinClosed:        agentv1.StdinCloseReason_STDIN_CLOSE_REASON_CLOSED,
	executor.StdinIdleTimeout:   agentv1.StdinCloseReason_STDIN_CLOSE_REASON_IDLE_TIMEOUT,
	executor.StdinProcessExited: agentv1.StdinCloseReason_STDIN_CLOSE_REASON_PROCESS_EXITED,
}

func stdinStateProto(st executor.StdinState) *agentv1.StdinState {
	return &agentv1.StdinState{AcceptedBytes: st.AcceptedBytes, Closed: st.Closed, Reason: stdinReasons[st.Reason], TaskFinished: st.TaskEnded}
}

// stdinError is a status with the input's state as its detail, so the
// output API can answer with the offset and the reason.
func stdinError(c codes.Code, st *agentv1.StdinState, format string, args ...any) error {
	s := status.Newf(c, format, args...)
	if d, err := s.WithDetails(st); err == nil {
		s = d
	}
	return s.Err()
}

// WriteStdin implements the WriteStdin RPC (docs/agent.md, docs/stdin.md).
func (s *Server) WriteStdin(ctx context.Context, req *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
	uid := req.GetUid()
	switch {
	case !validUID.MatchString(uid):
		return nil, status.Errorf(codes.InvalidArgument, "uid %q: letters, digits, '-', '_' and '.', 1 to 128 bytes", uid)
	case req.GetOffset() < 0:
		return nil, status.Errorf(codes.InvalidArgument, "offset %d: must not be negative", req.GetOffset())
	case len(req.GetData()) > agentv1.MaxStdinWriteBytes:
		return nil, status.Errorf(codes.InvalidArgument, "data is %d bytes, over the limit of %d per request", len(req.GetData()), agentv1.MaxStdinWriteBytes)
	}
	task, err := s.stdinTask(ctx, uid)
	if err != nil {
		return nil, err
	}
	st, err := task.WriteStdin(ctx, req.GetOffset(), req.GetData(), req.GetClose())
	ps := stdinStateProto(st)
	var oe *executor.StdinOffsetError
	switch {
	case err == nil:
		return &agentv1.WriteStdinResponse{State: ps}, nil
	case errors.Is(err, executor.ErrStdinNotStreamed):
		return nil, status.Errorf(codes.FailedPrecondition, "task %s: its standard input is not streamed (the TaskSpec has no stdin_stream; BashTask spec.stdinStream)", uid)
	case errors.As(err, &oe):
		return nil, stdinError(codes.OutOfRange, ps, "task %s: offset %d is past the %d bytes of stdin accepted: send from offset %d", uid, oe.Offset, oe.Accepted, oe.Accepted)
	case errors.Is(err, executor.ErrStdinClosed) && st.TaskEnded:
		return nil, stdinError(codes.FailedPrecondition, ps, "task %s has ended: its stdin accepts no bytes after the %d accepted", uid, st.AcceptedBytes)
	case errors.Is(err, executor.ErrStdinClosed):
		return nil, stdinError(codes.Aborted, ps, "task %s: stdin is closed (%s) after %d bytes: it accepts no more", uid, st.Reason, st.AcceptedBytes)
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	default:
		return nil, status.Errorf(codes.InvalidArgument, "task %s: %v", uid, err)
	}
}

// stdinTask finds the running task's handle; a task still starting is
// waited for. NOT_FOUND for an unknown UID, FAILED_PRECONDITION with
// task_finished for a task that ended without a handle in this
// incarnation (never started, or ran before a restart).
func (s *Server) stdinTask(ctx context.Context, uid string) (*executor.Task, error) {
	return awaitStart(ctx, s, uid, func(e *entry) (*executor.Task, error) {
		if e.task != nil {
			return e.task, nil
		}
		return nil, stdinError(codes.FailedPrecondition, &agentv1.StdinState{Closed: true, TaskFinished: true}, "task %s has ended: its stdin accepts no bytes", uid)
	})
}

// applyStdin copies a streamed input's state into status (TaskStatus.stdin).
func applyStdin(status *agentv1.TaskStatus, t *executor.Task) {
	if t == nil {
		return
	}
	if st, ok := t.StdinState(); ok {
		status.Stdin = stdinStateProto(st)
	}
}

// stdinChanged applies a streamed input's state to status and reports
// whether it differs from what status held: a reason for a progress event
// even when no output came.
func stdinChanged(status *agentv1.TaskStatus, t *executor.Task) bool {
	prev := status.GetStdin()
	applyStdin(status, t)
	return !proto.Equal(prev, status.GetStdin())
}
