package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// OutputChunkBytes is the most data one OutputChunk carries, 1 MiB: large
// enough that a follower of a bulk stream costs few messages, well below
// gRPC's 4 MiB default receive limit. A chunk carries what the spill file
// holds when it is read, so a slow writer's bytes go out at once and are
// not held back to fill a chunk.
const OutputChunkBytes = 1 << 20

// startingPoll is how often ReadOutput looks again at a task that is still
// starting (its record written, its process not yet created): a few
// milliseconds at most, so a short poll costs nothing and needs no
// notification of its own.
const startingPoll = 10 * time.Millisecond

// outputSource is the stream ReadOutput reads: a task this incarnation ran
// (its executor stream, which wakes followers on every append), or a
// finished one an earlier incarnation ran (fixed sizes from its status).
type outputSource struct {
	live   *executor.Task
	stderr bool
	fixed  executor.OutputState
}

// state returns the stream's state and a channel closed at its next change;
// nil when the stream has ended.
func (o *outputSource) state() (executor.OutputState, <-chan struct{}) {
	if o.live != nil {
		return o.live.Output(o.stderr)
	}
	return o.fixed, nil
}

// checkReadRequest checks what ReadOutput and ReadCombinedOutput are
// asked for: a task UID of the journal's form, and a byte offset and
// limit that are not negative. It returns an INVALID_ARGUMENT status
// naming the field.
func checkReadRequest(uid string, offset, limit int64) error {
	if !validUID.MatchString(uid) {
		return status.Errorf(codes.InvalidArgument, "uid %q: letters, digits, '-', '_' and '.', 1 to 128 bytes", uid)
	}
	if offset < 0 {
		return status.Errorf(codes.InvalidArgument, "offset %d: must not be negative", offset)
	}
	if limit < 0 {
		return status.Errorf(codes.InvalidArgument, "limit_bytes %d: must not be negative", limit)
	}
	return nil
}

// ReadOutput implements the ReadOutput RPC (docs/agent.md, docs/output.md).
func (s *Server) ReadOutput(req *agentv1.ReadOutputRequest, srv agentv1.Executor_ReadOutputServer) error {
	ctx := srv.Context()
	uid, offset, limit := req.GetUid(), req.GetOffset(), req.GetLimitBytes()
	if err := checkReadRequest(uid, offset, limit); err != nil {
		return err
	}
	name := streamNames[0]
	stderr := req.GetStream() == agentv1.OutputStream_OUTPUT_STREAM_STDERR
	if stderr {
		name = streamNames[1]
	}
	order := req.GetStream() == agentv1.OutputStream_OUTPUT_STREAM_ORDER
	if order {
		name = outputorder.Name
	}
	if req.GetObjectUrl() != "" || req.GetObjectKey() != "" {
		return s.readObject(req, name, srv)
	}
	if order {
		return status.Error(codes.InvalidArgument, "stream OUTPUT_STREAM_ORDER: served from the bucket only (object_url or object_key); ReadCombinedOutput frames a held task's streams in their order")
	}
	src, err := s.outputSource(ctx, uid, stderr, name)
	if err != nil {
		return err
	}

	st, changed := src.state()
	if err := checkOutputRange(name, st, offset); err != nil {
		return err
	}
	if err := srv.Send(&agentv1.OutputChunk{Offset: offset, Header: outputState(st)}); err != nil {
		return err
	}
	var f *os.File
	defer func() {
		if f != nil {
			_ = f.Close()
		}
	}()
	var buf []byte
	sent := int64(0)
	for {
		if limit > 0 && sent >= limit {
			return srv.Send(&agentv1.OutputChunk{Offset: offset, End: outputState(st)})
		}
		if offset < st.SpillBytes {
			if f == nil {
				// The spill file is opened once, when it holds a byte
				// wanted; a Forget removing it meanwhile does not take
				// the open file away.
				if f, err = os.Open(st.SpillPath); err != nil {
					return status.Errorf(codes.DataLoss, "%s from offset %d: opening the spill file: %v", name, offset, err)
				}
			}
			n := min(st.SpillBytes-offset, OutputChunkBytes)
			if limit > 0 {
				n = min(n, limit-sent)
			}
			if buf == nil {
				buf = make([]byte, min(st.SpillBytes-offset, OutputChunkBytes))
			}
			if int64(len(buf)) < n {
				buf = make([]byte, OutputChunkBytes)
			}
			got, rerr := f.ReadAt(buf[:n], offset)
			if got > 0 {
				if err := srv.Send(&agentv1.OutputChunk{Offset: offset, Data: buf[:got]}); err != nil {
					return err
				}
				offset += int64(got)
				sent += int64(got)
			}
			if rerr != nil && (!errors.Is(rerr, io.EOF) || got == 0) {
				// The file is shorter than the count the executor
				// published after writing it: changed under the agent.
				return status.Errorf(codes.DataLoss, "%s from offset %d: reading the spill file: %v", name, offset, rerr)
			}
			st, changed = src.state()
			continue
		}
		if err := checkOutputRange(name, st, offset); err != nil {
			return err
		}
		if st.Ended || !req.GetFollow() {
			return srv.Send(&agentv1.OutputChunk{Offset: offset, End: outputState(st)})
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		st, changed = src.state()
	}
}

// outputSource finds the task's stream. A task still starting is waited
// for; NOT_FOUND for an unknown UID.
func (s *Server) outputSource(ctx context.Context, uid string, stderr bool, name string) (*outputSource, error) {
	return awaitStart(ctx, s, uid, func(e *entry) (*outputSource, error) {
		if e.task != nil {
			return &outputSource{live: e.task, stderr: stderr}, nil
		}
		// Finished without a handle: never started, or run by an earlier
		// incarnation; its status holds the final sizes.
		ss := e.status.GetStdout()
		if stderr {
			ss = e.status.GetStderr()
		}
		return &outputSource{fixed: executor.OutputState{
			SpillPath:       filepath.Join(s.store.outputDir(uid), name),
			SpillBytes:      ss.GetSpill().GetBytes(),
			TotalBytes:      ss.GetTotalBytes(),
			SpillLimitBytes: e.rec.SpillLimitBytes,
			Ended:           true,
		}}, nil
	})
}

// awaitStart waits, polling every startingPoll, until task uid is past its
// start (it has a handle, or it ended without one) and returns what
// settled makes of its entry, called with Server.mu held. NOT_FOUND for a
// UID the agent does not know; ctx's error while it waits. ReadOutput and
// WriteStdin both may come before the process exists: a client that
// created the task a moment ago does not know when it starts.
func awaitStart[T any](ctx context.Context, s *Server, uid string, settled func(e *entry) (T, error)) (T, error) {
	var tick *time.Ticker
	for {
		s.mu.Lock()
		e, ok := s.tasks[uid]
		if !ok {
			s.mu.Unlock()
			var zero T
			return zero, status.Errorf(codes.NotFound, "task %s is unknown to this agent", uid)
		}
		if e.task != nil || !e.starting() {
			defer s.mu.Unlock()
			return settled(e)
		}
		s.mu.Unlock()
		if tick == nil {
			tick = time.NewTicker(startingPoll)
			defer tick.Stop()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			var zero T
			return zero, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// checkOutputRange refuses an offset whose bytes cannot be served: past the
// end of an ended stream (OUT_OF_RANGE), or at or past the end of a spill
// file that stopped short of the stream (DATA_LOSS). An offset past the
// bytes known of a running stream is no error: they may still come.
func checkOutputRange(name string, st executor.OutputState, offset int64) error {
	if offset >= st.SpillBytes && st.TotalBytes > st.SpillBytes {
		why := fmt.Sprintf("the spill file holds only the first %d bytes (spillLimitBytes %d)", st.SpillBytes, st.SpillLimitBytes)
		if st.SpillFailed || st.SpillBytes < st.SpillLimitBytes {
			why = fmt.Sprintf("writing the spill file failed after %d bytes", st.SpillBytes)
		}
		return status.Errorf(codes.DataLoss, "%s from offset %d is not kept: %s of %d written", name, offset, why, st.TotalBytes)
	}
	if st.Ended && offset > st.TotalBytes {
		return status.Errorf(codes.OutOfRange, "%s offset %d is past the stream's end at %d bytes", name, offset, st.TotalBytes)
	}
	return nil
}

func outputState(st executor.OutputState) *agentv1.OutputState {
	return &agentv1.OutputState{TotalBytes: st.TotalBytes, Complete: st.Ended, SpillBytes: st.SpillBytes}
}
