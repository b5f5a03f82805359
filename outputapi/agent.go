package outputapi

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// errAgentBroke marks an agent stream that broke after it began: the agent
// went away (a restart) while it held the task, so it is asked again.
var errAgentBroke = errors.New("the agent's stream broke")

// fromAgent streams from the node's agent: the task's spill file (both
// spill files framed in their order for StreamAll), or with objectURL its
// uploaded copy, which the agent reads from its own bucket.
// ended is true when the response is over (successfully or with an error to
// report); false with an error when another source, or the same agent
// later, should be tried.
func (s *Server) fromAgent(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, node string, stream agentv1.OutputStream, o outputv1alpha1.LogOptions, objectURL string) (ended bool, err error) {
	c, err := s.cfg.Agents.Client(ctx, node)
	if err != nil {
		return false, err
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var rs interface {
		Recv() (*agentv1.OutputChunk, error)
	}
	if o.Stream == outputv1alpha1.StreamAll && objectURL == "" {
		rs, err = c.ReadCombinedOutput(actx, &agentv1.ReadCombinedOutputRequest{
			Uid: string(task.UID), Offset: lr.offset, Follow: o.Follow, LimitBytes: lr.remaining(),
		})
	} else {
		rs, err = c.ReadOutput(actx, &agentv1.ReadOutputRequest{
			Uid: string(task.UID), Stream: stream, Offset: lr.offset, Follow: o.Follow, LimitBytes: lr.remaining(),
			ObjectUrl: objectURL,
		})
	}
	if err != nil {
		return false, err
	}
	gotAny := false
	for {
		m, err := rs.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return true, fmt.Errorf("%s from offset %d: the agent's stream ended without its end message", o.Stream, lr.offset)
			}
			switch status.Code(err) {
			case codes.DataLoss:
				if !lr.started {
					return true, goneError(status.Convert(err).Message())
				}
				return true, errors.New(status.Convert(err).Message())
			case codes.OutOfRange:
				return true, rangeNotSatisfiable(status.Convert(err).Message())
			case codes.NotFound:
				return false, err
			case codes.Unimplemented:
				// An agent of a version before ReadCombinedOutput.
				msg := fmt.Sprintf("%s of task %s/%s: the agent of node %s does not serve it (%s); read stdout and stderr on their own",
					o.Stream, task.Namespace, task.Name, node, status.Convert(err).Message())
				if !lr.started {
					return true, apierrors.NewServiceUnavailable(msg)
				}
				return true, errors.New(msg)
			case codes.Canceled:
				if ctx.Err() != nil {
					return true, context.Cause(ctx)
				}
			}
			if gotAny {
				return false, fmt.Errorf("%w: %w", errAgentBroke, err)
			}
			return false, err
		}
		gotAny = true
		switch {
		case m.GetHeader() != nil:
			if !lr.started {
				h := m.GetHeader()
				lr.start(task.UID, lr.offset, h.GetTotalBytes(), h.GetComplete())
			}
		case m.GetEnd() != nil:
			if !o.Follow || m.GetEnd().GetComplete() || lr.done() {
				return true, nil
			}
			return false, fmt.Errorf("%w: ended before the stream did", errAgentBroke)
		default:
			if m.GetOffset() != lr.offset {
				return true, fmt.Errorf("%s: the agent sent offset %d, expected %d", o.Stream, m.GetOffset(), lr.offset)
			}
			if err := lr.write(m.GetData()); err != nil {
				cancel()
				return true, err
			}
		}
	}
}

// fromAgentBucket serves a finished task's uploaded copy at objURL through
// the agent of its node, which reads it from its own bucket (ReadOutput
// with object_url): for the copies the controller cannot read itself.
// gone builds the error for bytes that cannot be served.
func (s *Server) fromAgentBucket(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o outputv1alpha1.LogOptions, objURL string, gone func(string) error) error {
	node := ptr.Deref(task.Status.NodeName, "")
	if node == "" {
		return gone(fmt.Sprintf("the uploaded copy %s is not in the controller's bucket and the task has no node whose agent could read it", objURL))
	}
	ended, err := s.fromAgent(ctx, lr, task, node, stream, o, objURL)
	if err == nil || ended {
		return err
	}
	switch status.Code(err) {
	case codes.NotFound:
		return gone(fmt.Sprintf("the agent of node %s reading the uploaded copy %s: %s", node, objURL, status.Convert(err).Message()))
	case codes.FailedPrecondition, codes.InvalidArgument:
		return gone(fmt.Sprintf("the uploaded copy %s is not in the controller's bucket and the agent of node %s does not serve it: %s",
			objURL, node, status.Convert(err).Message()))
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	msg := fmt.Sprintf("%s of task %s/%s from offset %d: reading the uploaded copy %s through the agent of node %s: %v",
		o.Stream, task.Namespace, task.Name, lr.offset, objURL, node, err)
	if lr.started {
		return errors.New(msg)
	}
	return apierrors.NewServiceUnavailable(msg)
}
