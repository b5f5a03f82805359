package outputapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// stdinRequestWait bounds how long one bashtasks/stdin request waits for
// the task to start on its agent and for room in the agent's buffer
// (back-pressure). kube-apiserver's proxy of an aggregated request that it
// does not count as long-running (its list has log, exec and attach, not
// this subresource) ends it after --request-timeout, 60 s by default, so
// the answer must come well before: 30 s. A request cut short by it is
// answered 200 with the offset reached; the client sends the rest from
// there.
const stdinRequestWait = 30 * time.Second

// stdinQueryTimeout bounds the query of the offset after a wait ended.
const stdinQueryTimeout = 10 * time.Second

// stdinREST serves bashtasks/stdin as a rest.Connecter for POST: the REST
// machinery authenticates, authorizes (create on bashtasks/stdin of
// output.bashtask.dev, as pods/exec is a create), decodes StdinOptions and
// hands over the request with its raw body.
type stdinREST struct {
	subresource
	s *Server
}

var (
	_ rest.Connecter            = (*stdinREST)(nil)
	_ rest.Storage              = (*stdinREST)(nil)
	_ rest.Scoper               = (*stdinREST)(nil)
	_ rest.SingularNameProvider = (*stdinREST)(nil)
)

// Connect implements rest.Connecter.
func (l *stdinREST) Connect(ctx context.Context, name string, opts runtime.Object, r rest.Responder) (http.Handler, error) {
	o, ok := opts.(*outputv1alpha1.StdinOptions)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected options %T", opts))
	}
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		l.s.serveStdin(w, req, r, ns, name, *o)
	}), nil
}

// setStdinHeaders writes the input's state into the response headers.
func setStdinHeaders(w http.ResponseWriter, st *agentv1.StdinState) {
	h := w.Header()
	h.Set(outputv1alpha1.HeaderStdinOffset, strconv.FormatInt(st.GetAcceptedBytes(), 10))
	h.Set(outputv1alpha1.HeaderStdinClosed, strconv.FormatBool(st.GetClosed()))
	if r := stdinReasonName(st.GetReason()); r != "" {
		h.Set(outputv1alpha1.HeaderStdinReason, r)
	}
}

func stdinReasonName(r agentv1.StdinCloseReason) string {
	switch r {
	case agentv1.StdinCloseReason_STDIN_CLOSE_REASON_CLOSED:
		return outputv1alpha1.StdinReasonClosed
	case agentv1.StdinCloseReason_STDIN_CLOSE_REASON_IDLE_TIMEOUT:
		return outputv1alpha1.StdinReasonIdleTimeout
	case agentv1.StdinCloseReason_STDIN_CLOSE_REASON_PROCESS_EXITED:
		return outputv1alpha1.StdinReasonProcessExited
	}
	return ""
}

// stdinDetail is the StdinState an agent's error carries, or nil.
func stdinDetail(err error) *agentv1.StdinState {
	for _, d := range status.Convert(err).Details() {
		if st, ok := d.(*agentv1.StdinState); ok {
			return st
		}
	}
	return nil
}

func conflict(msg string) *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonConflict, Message: msg,
	}}
}

// serveStdin answers one bashtasks/stdin request (docs/stdin.md).
func (s *Server) serveStdin(w http.ResponseWriter, req *http.Request, r rest.Responder, ns, name string, o outputv1alpha1.StdinOptions) {
	ctx := req.Context()
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, outputv1alpha1.StdinRequestBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			r.Error(apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the body of a bashtasks/stdin request is at most %d bytes (output.bashtask.dev/v1alpha1 StdinRequestBytes): send larger input in several requests", outputv1alpha1.StdinRequestBytes)))
			return
		}
		r.Error(apierrors.NewBadRequest(fmt.Sprintf("reading the body: %v", err)))
		return
	}
	task, err := s.getTask(ctx, ns, name)
	if err != nil {
		r.Error(err)
		return
	}
	if task.Spec.StdinStream == nil {
		r.Error(apierrors.NewBadRequest(fmt.Sprintf("BashTask %s/%s has no spec.stdinStream: its standard input is not streamed (set spec.stdinStream when creating the task)", ns, name)))
		return
	}
	wctx, cancel := context.WithTimeout(ctx, stdinRequestWait)
	defer cancel()
	st, err := s.writeStdin(wctx, task, o.Offset, body, o.Close)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		// The bounded wait ended (the command does not read, or the task
		// has not started): answer with the offset reached, which the
		// client resumes from.
		qctx, qcancel := context.WithTimeout(ctx, stdinQueryTimeout)
		defer qcancel()
		qst, qerr := s.writeStdin(qctx, task, 0, nil, false)
		var se *apierrors.StatusError
		switch {
		case errors.As(qerr, &se):
			st, err = qst, qerr
		case qerr != nil:
			st, err = nil, apierrors.NewServiceUnavailable(fmt.Sprintf("stdin of task %s/%s: the task did not start within %s: send again", ns, name, stdinRequestWait+stdinQueryTimeout))
		case qst.GetAcceptedBytes() > o.Offset || len(body) == 0:
			st, err = qst, nil
		default:
			st, err = qst, apierrors.NewServiceUnavailable(fmt.Sprintf("stdin of task %s/%s: no byte accepted within %s (its command does not read): send again from offset %d", ns, name, stdinRequestWait, qst.GetAcceptedBytes()))
		}
	}
	if st != nil {
		setStdinHeaders(w, st)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // the client went away
		}
		r.Error(err)
		return
	}
	w.Header().Set(outputv1alpha1.HeaderTaskUID, string(task.UID))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}

// writeStdin sends one write to the task's agent, waiting for the task's
// dispatch and start and across an agent restart until ctx ends. It
// returns the input's state (also with a 409) and an API status error.
func (s *Server) writeStdin(ctx context.Context, task *bashtaskv1alpha1.BashTask, offset int64, data []byte, closeAfter bool) (*agentv1.StdinState, error) {
	retry := agentFirstRetry
	for {
		if finished(task) {
			return nil, goneError(fmt.Sprintf("BashTask %s/%s has ended (%s): its standard input accepts no bytes", task.Namespace, task.Name, *task.Status.Reason))
		}
		if task.Status.NodeName == nil || *task.Status.NodeName == "" {
			t, err := s.waitDispatched(ctx, task)
			if err != nil {
				return nil, stdinWaitError(ctx, task, err)
			}
			task = t
			continue
		}
		c, err := s.cfg.Agents.Client(ctx, *task.Status.NodeName)
		if err == nil {
			var resp *agentv1.WriteStdinResponse
			resp, err = c.WriteStdin(ctx, &agentv1.WriteStdinRequest{Uid: string(task.UID), Offset: offset, Data: data, Close: closeAfter})
			if err == nil {
				return resp.GetState(), nil
			}
			msg := status.Convert(err).Message()
			switch status.Code(err) {
			case codes.OutOfRange:
				return stdinDetail(err), conflict(msg)
			case codes.Aborted:
				return stdinDetail(err), conflict(msg)
			case codes.FailedPrecondition:
				if d := stdinDetail(err); d != nil && d.GetTaskFinished() {
					return d, goneError(msg)
				}
				return nil, apierrors.NewBadRequest(msg)
			case codes.InvalidArgument:
				return nil, apierrors.NewBadRequest(msg)
			}
			// NOT_FOUND: dispatched (the node is written first) but not
			// started yet, or forgotten after its end; UNAVAILABLE: the
			// agent restarting. Both are looked at again below.
		}
		if werr := s.waitRetry(ctx, task, retry); werr != nil {
			return nil, stdinWaitError(ctx, task, err)
		}
		retry = min(2*retry, agentRetryInterval)
		fresh, gerr := s.refetch(ctx, task)
		if gerr != nil {
			if errors.Is(gerr, errTaskGone) {
				return nil, goneError(fmt.Sprintf("BashTask %s/%s (uid %s) was deleted", task.Namespace, task.Name, task.UID))
			}
			return nil, stdinWaitError(ctx, task, gerr)
		}
		task = fresh
	}
}

func stdinWaitError(ctx context.Context, task *bashtaskv1alpha1.BashTask, err error) error {
	if errors.Is(err, errTaskGone) {
		return goneError(fmt.Sprintf("BashTask %s/%s (uid %s) was deleted", task.Namespace, task.Name, task.UID))
	}
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return apierrors.NewServiceUnavailable(fmt.Sprintf("stdin of task %s/%s: %v", task.Namespace, task.Name, err))
}
