package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// The Terminal service (api/agent/v1/terminal.proto; docs/agent.md,
// "Terminal"): attach sessions that write a client's input and window
// sizes to a task's terminal (TaskSpec.tty). The terminal's output is the
// task's stdout, which the client reads with ReadOutput.

// Limits of the attach sessions: per task, and per session in memory.
const (
	// MaxTerminalSessions is the most attach sessions one task has open
	// at once; one more is refused with RESOURCE_EXHAUSTED.
	MaxTerminalSessions = 8
	// TerminalInputBytes is the most input one TerminalInput carries, 64
	// KiB. A session holds one message at a time (the next waits in
	// gRPC's flow control until the terminal took this one), so its
	// memory is bounded by this and the transport's window.
	TerminalInputBytes = 64 << 10
	// TerminalReplayBytes is how much of the terminal's recent output an
	// attach shows first (TerminalAttached.replay_offset): 32 KiB, a few
	// full screens with their escape sequences.
	TerminalReplayBytes = 32 << 10
)

// DefaultTerminalSize is a terminal's window size until the first client
// sets one: 24 rows of 80 columns, the VT100's, which terminal emulators
// open with.
var DefaultTerminalSize = executor.WindowSize{Rows: 24, Cols: 80}

// terminalServer implements agentv1.TerminalServer.
type terminalServer struct {
	agentv1.UnimplementedTerminalServer
	s *Server

	mu       sync.Mutex
	sessions map[string]int // open attach sessions by task UID
}

// Attach implements the Attach RPC.
func (ts *terminalServer) Attach(stream agentv1.Terminal_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	uid := first.GetUid()
	if !validUID.MatchString(uid) {
		return status.Errorf(codes.InvalidArgument, "uid %q: letters, digits, '-', '_' and '.', 1 to 128 bytes", uid)
	}
	task, term, err := ts.terminal(stream.Context(), uid)
	if err != nil {
		return err
	}
	release, err := ts.acquire(uid)
	if err != nil {
		return err
	}
	defer release()
	if err := applyInput(stream.Context(), term, first); err != nil {
		if errors.Is(err, executor.ErrTerminalClosed) {
			return status.Errorf(codes.FailedPrecondition, "task %s has ended: its terminal is closed", uid)
		}
		return err
	}
	st, _ := task.Output(false)
	replay := max(st.TotalBytes-TerminalReplayBytes, 0)
	if err := stream.Send(&agentv1.TerminalEvent{Attached: &agentv1.TerminalAttached{ReplayOffset: replay}}); err != nil {
		return err
	}
	return ts.relay(stream, task, term)
}

// terminal finds the running task uid and its terminal, waiting for a
// task still starting: NOT_FOUND for an unknown task, FAILED_PRECONDITION
// for one that has ended or has no terminal.
func (ts *terminalServer) terminal(ctx context.Context, uid string) (*executor.Task, *executor.Terminal, error) {
	task, err := awaitStart(ctx, ts.s, uid, func(e *entry) (*executor.Task, error) {
		if e.task == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "task %s has ended (%s): its terminal is closed", uid, cmpOr(e.status.GetReason(), "not started"))
		}
		return e.task, nil
	})
	if err != nil {
		return nil, nil, err
	}
	term, err := task.Terminal()
	if errors.Is(err, executor.ErrNoTerminal) {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "task %s has no terminal: it was created without spec.tty", uid)
	}
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "task %s: %v", uid, err)
	}
	select {
	case <-task.Done():
		return nil, nil, status.Errorf(codes.FailedPrecondition, "task %s has ended: its terminal is closed", uid)
	default:
	}
	return task, term, nil
}

// acquire counts a session of task uid, refusing one past
// MaxTerminalSessions; release uncounts it.
func (ts *terminalServer) acquire(uid string) (release func(), err error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.sessions == nil {
		ts.sessions = map[string]int{}
	}
	if n := ts.sessions[uid]; n >= MaxTerminalSessions {
		return nil, status.Errorf(codes.ResourceExhausted, "task %s has %d attach sessions open, the most a task may have (MaxTerminalSessions): close one first", uid, n)
	}
	ts.sessions[uid]++
	return func() {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if ts.sessions[uid]--; ts.sessions[uid] == 0 {
			delete(ts.sessions, uid)
		}
	}, nil
}

// relay writes the session's input to the terminal until the client ends
// its side (the session ends, the task runs on) or the task ends (the
// client is told, closed).
func (ts *terminalServer) relay(stream agentv1.Terminal_AttachServer, task *executor.Task, term *executor.Terminal) error {
	ctx := stream.Context()
	inputs := make(chan *agentv1.TerminalInput)
	recvErr := make(chan error, 1)
	go func() {
		for {
			in, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case inputs <- in:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case in := <-inputs:
			err := applyInput(ctx, term, in)
			if errors.Is(err, executor.ErrTerminalClosed) {
				<-task.Done()
				return stream.Send(&agentv1.TerminalEvent{Closed: true})
			}
			if err != nil {
				return err
			}
		case <-task.Done():
			return stream.Send(&agentv1.TerminalEvent{Closed: true})
		case err := <-recvErr:
			if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return ignoreEOF(err)
		}
	}
}

// applyInput applies one message: the window size first, then the input
// bytes. INVALID_ARGUMENT for input over TerminalInputBytes or a size
// out of range; executor.ErrTerminalClosed once the task ended.
func applyInput(ctx context.Context, term *executor.Terminal, in *agentv1.TerminalInput) error {
	if len(in.GetData()) > TerminalInputBytes {
		return status.Errorf(codes.InvalidArgument, "data of %d bytes: at most %d (TerminalInputBytes) per message", len(in.GetData()), TerminalInputBytes)
	}
	if r := in.GetResize(); r != nil {
		if r.GetRows() < 1 || r.GetRows() > 65535 || r.GetCols() < 1 || r.GetCols() > 65535 {
			return status.Errorf(codes.InvalidArgument, "resize %dx%d (rows x cols): each must be 1 to 65535", r.GetRows(), r.GetCols())
		}
		if err := term.Resize(executor.WindowSize{Rows: uint16(r.GetRows()), Cols: uint16(r.GetCols())}); err != nil {
			return err
		}
	}
	if len(in.GetData()) > 0 {
		return term.Write(ctx, in.GetData())
	}
	return nil
}

// ignoreEOF makes the client's end of its side (io.EOF) a normal end.
func ignoreEOF(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return fmt.Errorf("receiving terminal input: %w", err)
}
