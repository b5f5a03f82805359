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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/streaming/pkg/httpstream/wsstream"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// bashtasks/attach (docs/output.md, "A terminal"): a WebSocket session on
// a task's terminal (spec.tty). The output API checks the request, waits
// for the task's start, opens an attach session with the task's agent
// (the Terminal service) and only then upgrades the connection, so that
// each refusal is an ordinary API status naming its cause. Then the
// terminal's output, the task's stdout from the agent's replay offset
// (ReadOutput, follow), goes out on channel 1; channel 0's input and
// channel 4's window sizes go to the agent; the task's end sends its exit
// code on channel 3 as `kubectl exec` receives it.

// TerminalAgents hands out clients of the agents' Terminal service
// (agentpool.AgentReaders); Config.Agents implements it to serve
// bashtasks/attach.
type TerminalAgents interface {
	// TerminalClient returns a Terminal client for node's agent, or an
	// error when none is reachable.
	TerminalClient(ctx context.Context, node string) (agentv1.TerminalClient, error)
}

// Bounds of an attach request.
const (
	// attachStartWait bounds the wait of an attach for its task's start
	// (a task created a moment ago, `kubectl bashtask run -t`); past it
	// the attach is refused as the task is not running.
	attachStartWait = 30 * time.Second
	// attachExitWait bounds the wait for the ended task's exit code in
	// its status after the terminal closed.
	attachExitWait = 10 * time.Second
)

// attachREST serves bashtasks/attach as a rest.Connecter for GET: the REST
// machinery authenticates, authorizes get on bashtasks/attach and decodes
// AttachOptions; serveAttach authorizes create besides.
type attachREST struct {
	subresource
	s *Server
}

var (
	_ rest.Connecter            = (*attachREST)(nil)
	_ rest.Storage              = (*attachREST)(nil)
	_ rest.Scoper               = (*attachREST)(nil)
	_ rest.SingularNameProvider = (*attachREST)(nil)
)

// Connect implements rest.Connecter.
func (a *attachREST) Connect(ctx context.Context, name string, opts runtime.Object, r rest.Responder) (http.Handler, error) {
	o, ok := opts.(*outputv1alpha1.AttachOptions)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected options %T", opts))
	}
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		a.s.serveAttach(w, req, r, ns, name, *o)
	}), nil
}

// decodeAttachOptions reads the query parameters; a bad value is an error
// naming the parameter.
func decodeAttachOptions(q map[string][]string, o *outputv1alpha1.AttachOptions) error {
	if v := firstValue(q, outputv1alpha1.ParamStdin); v != "" {
		var err error
		if o.Stdin, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("stdin %q: must be true or false", v)
		}
	}
	return nil
}

func firstValue(q map[string][]string, name string) string {
	if v := q[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// serveAttach answers one bashtasks/attach request.
func (s *Server) serveAttach(w http.ResponseWriter, req *http.Request, r rest.Responder, ns, name string, o outputv1alpha1.AttachOptions) {
	ctx := req.Context()
	if !wsstream.IsWebSocketRequest(req) {
		r.Error(apierrors.NewBadRequest("bashtasks/attach is a WebSocket upgrade speaking " + attachProtocol + " (kubectl bashtask attach, or client-go's remotecommand WebSocket executor)"))
		return
	}
	if err := s.authorizeAttach(ctx, ns, name); err != nil {
		r.Error(err)
		return
	}
	task, err := s.getTask(ctx, ns, name)
	if err != nil {
		r.Error(err)
		return
	}
	sess, err := s.openTerminal(ctx, task)
	if err != nil {
		r.Error(err)
		return
	}
	defer sess.cancel()
	streams, err := openAttachStreams(w, req, o.Stdin)
	if err != nil {
		return // the upgrade answered the client
	}
	defer streams.conn.Close()
	s.runAttach(ctx, sess, streams)
}

// authorizeAttach asks the authorizer for create on bashtasks/attach, as
// Kubernetes asks of pods/attach over WebSocket: the REST machinery has
// authorized the GET as get.
func (s *Server) authorizeAttach(ctx context.Context, ns, name string) error {
	if s.authz == nil {
		return nil
	}
	u, _ := genericapirequest.UserFrom(ctx)
	attrs := authorizer.AttributesRecord{
		User: u, Verb: "create", Namespace: ns, Name: name, ResourceRequest: true,
		APIGroup: outputv1alpha1.Group, APIVersion: outputv1alpha1.Version,
		Resource: outputv1alpha1.Resource, Subresource: outputv1alpha1.SubresourceAttach,
	}
	d, why, err := s.authz.Authorize(ctx, attrs)
	if d == authorizer.DecisionAllow {
		return nil
	}
	if err != nil {
		why = err.Error()
	}
	gr := schema.GroupResource{Group: outputv1alpha1.Group, Resource: outputv1alpha1.Resource + "/" + outputv1alpha1.SubresourceAttach}
	return apierrors.NewForbidden(gr, name, fmt.Errorf("attaching to a terminal needs create on %s/%s in %s besides get: %s", outputv1alpha1.Resource, outputv1alpha1.SubresourceAttach, outputv1alpha1.Group, cmpOrString(why, "no rule allows it")))
}

func cmpOrString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// terminalSession is an attach session with a task's agent.
type terminalSession struct {
	task   *bashtaskv1alpha1.BashTask
	stream agentv1.Terminal_AttachClient
	out    agentv1.ExecutorClient
	replay int64
	cancel context.CancelFunc
}

// openTerminal opens an attach session on task's terminal, waiting up to
// attachStartWait for its start and across an agent restart. Each
// refusal is an API status naming its cause: no spec.tty (400), the task
// ended (410), not running in time (503), too many sessions (429).
func (s *Server) openTerminal(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*terminalSession, error) {
	if !ptr.Deref(task.Spec.TTY, false) {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("BashTask %s/%s has no terminal: it was created without spec.tty (its output is at bashtasks/log)", task.Namespace, task.Name))
	}
	ta, ok := s.cfg.Agents.(TerminalAgents)
	if !ok {
		return nil, apierrors.NewInternalError(errors.New("the output API's agents offer no Terminal client"))
	}
	wctx, cancel := context.WithTimeout(ctx, attachStartWait)
	defer cancel()
	retry := agentFirstRetry
	for {
		if finished(task) {
			return nil, goneError(fmt.Sprintf("BashTask %s/%s has ended (%s): its terminal is closed", task.Namespace, task.Name, *task.Status.Reason))
		}
		if !dispatched(task) {
			t, err := s.waitDispatched(wctx, task)
			if err != nil {
				return nil, s.attachWaitError(ctx, task, err)
			}
			task = t
			continue
		}
		sess, err := s.attachAgent(ctx, ta, task)
		if err == nil || !retryable(err) {
			return sess, err
		}
		if werr := s.waitRetry(wctx, task, retry); werr != nil {
			return nil, s.attachWaitError(ctx, task, werr)
		}
		retry = min(2*retry, agentRetryInterval)
		t, err := s.refetch(ctx, task)
		if err != nil {
			return nil, s.attachWaitError(ctx, task, err)
		}
		task = t
	}
}

// retryable reports whether an agent's answer may change: the task not
// started yet there (NOT_FOUND) or the agent restarting (UNAVAILABLE).
func retryable(err error) bool {
	c := status.Code(err)
	return c == codes.NotFound || c == codes.Unavailable
}

// attachWaitError is the answer of an attach whose wait for its task
// ended: gone, the client's own end, or a task not running in time.
func (s *Server) attachWaitError(ctx context.Context, task *bashtaskv1alpha1.BashTask, err error) error {
	switch {
	case errors.Is(err, errTaskGone):
		return goneError(fmt.Sprintf("BashTask %s/%s (uid %s) was deleted", task.Namespace, task.Name, task.UID))
	case ctx.Err() != nil:
		return ctx.Err()
	}
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return err
	}
	return apierrors.NewServiceUnavailable(fmt.Sprintf("BashTask %s/%s is not running: its terminal did not open within %s (%v)", task.Namespace, task.Name, attachStartWait, err))
}

// attachAgent opens the session with the task's agent. It returns a
// retryable gRPC error, or an API status for a refusal.
func (s *Server) attachAgent(ctx context.Context, ta TerminalAgents, task *bashtaskv1alpha1.BashTask) (*terminalSession, error) {
	node := *task.Status.NodeName
	tc, err := ta.TerminalClient(ctx, node)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	out, err := s.cfg.Agents.Client(ctx, node)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := tc.Attach(sctx)
	if err == nil {
		err = stream.Send(&agentv1.TerminalInput{Uid: string(task.UID)})
	}
	var ev *agentv1.TerminalEvent
	if err == nil || errors.Is(err, io.EOF) {
		ev, err = stream.Recv()
	}
	if err != nil {
		cancel()
		return nil, agentAttachError(task, err)
	}
	return &terminalSession{task: task, stream: stream, out: out, replay: ev.GetAttached().GetReplayOffset(), cancel: cancel}, nil
}

// agentAttachError maps the agent's refusal of an attach to an API status,
// leaving the retryable codes as they are.
func agentAttachError(task *bashtaskv1alpha1.BashTask, err error) error {
	msg := fmt.Sprintf("BashTask %s/%s: %s", task.Namespace, task.Name, status.Convert(err).Message())
	switch status.Code(err) {
	case codes.FailedPrecondition:
		return goneError(msg)
	case codes.ResourceExhausted:
		return apierrors.NewTooManyRequests(msg, 1)
	case codes.InvalidArgument:
		return apierrors.NewBadRequest(msg)
	case codes.NotFound, codes.Unavailable:
		return err
	}
	return apierrors.NewInternalError(errors.New(msg))
}
