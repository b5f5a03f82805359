package outputapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gocloud.dev/gcerrors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
)

// Intervals of a followed response.
const (
	// taskCheckInterval is how often a follow looks at the task in the
	// controller's cache (an in-memory read) to notice its deletion, its
	// dispatch while it waited for one, and its end while its agent is
	// unreachable.
	taskCheckInterval = time.Second
	// agentRetryInterval is the wait before a follow asks an agent again
	// after its stream broke (an agent restarting comes back within
	// seconds; the task ends AgentLost if it does not).
	agentRetryInterval = 500 * time.Millisecond
)

// errTaskGone is the cause of a follow ended because its task was deleted
// or re-created under the same name.
var errTaskGone = errors.New("the BashTask was deleted")

// logREST serves bashtasks/log as a rest.Connecter: the REST machinery
// authenticates, authorizes (get on bashtasks/log of output.bashtask.dev),
// decodes LogOptions and then hands over the ResponseWriter, which the
// response needs for its headers and trailers. A rest.ResourceStreamer
// would only get to return a body: no response headers, no trailers.
type logREST struct {
	s *Server
}

var (
	_ rest.Connecter            = (*logREST)(nil)
	_ rest.Storage              = (*logREST)(nil)
	_ rest.Scoper               = (*logREST)(nil)
	_ rest.SingularNameProvider = (*logREST)(nil)
)

func (l *logREST) New() runtime.Object      { return &LogOptions{} }
func (l *logREST) Destroy()                 {}
func (l *logREST) NamespaceScoped() bool    { return true }
func (l *logREST) GetSingularName() string  { return "bashtask" }
func (l *logREST) ConnectMethods() []string { return []string{http.MethodGet} }
func (l *logREST) NewConnectOptions() (runtime.Object, bool, string) {
	return &LogOptions{}, false, ""
}

// Connect implements rest.Connecter.
func (l *logREST) Connect(ctx context.Context, name string, opts runtime.Object, r rest.Responder) (http.Handler, error) {
	o, ok := opts.(*LogOptions)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected options %T", opts))
	}
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		l.s.serveLog(w, req, r, ns, name, *o)
	}), nil
}

// logResponse is one response in progress: the headers are written once,
// before the first byte, with the state known at the start.
type logResponse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	offset  int64 // of the next byte to write
	sent    int64
	limit   int64
}

func (lr *logResponse) start(uid types.UID, offset, total int64, complete bool) {
	h := lr.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set(btclient.HeaderOffset, strconv.FormatInt(offset, 10))
	h.Set(btclient.HeaderTotal, strconv.FormatInt(total, 10))
	h.Set(btclient.HeaderComplete, strconv.FormatBool(complete))
	h.Set(btclient.HeaderTaskUID, string(uid))
	h.Set("Trailer", btclient.TrailerEndOffset+", "+btclient.TrailerError)
	lr.w.WriteHeader(http.StatusOK)
	_ = lr.rc.Flush()
	lr.started = true
}

// write sends bytes at lr.offset and flushes them: a follower sees each
// chunk as the agent sends it.
func (lr *logResponse) write(p []byte) error {
	if _, err := lr.w.Write(p); err != nil {
		return err
	}
	lr.offset += int64(len(p))
	lr.sent += int64(len(p))
	return lr.rc.Flush()
}

// fail ends a started response with the trailers naming where and why.
func (lr *logResponse) fail(msg string) {
	lr.w.Header().Set(btclient.TrailerEndOffset, strconv.FormatInt(lr.offset, 10))
	lr.w.Header().Set(btclient.TrailerError, msg)
}

func (lr *logResponse) remaining() int64 {
	if lr.limit <= 0 {
		return 0
	}
	return max(lr.limit-lr.sent, 0)
}

func (lr *logResponse) done() bool { return lr.limit > 0 && lr.sent >= lr.limit }

// serveLog answers one bashtasks/log request (docs/output.md).
func (s *Server) serveLog(w http.ResponseWriter, req *http.Request, r rest.Responder, ns, name string, o LogOptions) {
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	lr := &logResponse{w: w, rc: http.NewResponseController(w), offset: o.Offset, limit: o.LimitBytes}
	stream := agentv1.OutputStream_OUTPUT_STREAM_STDOUT
	if o.Stream == "stderr" {
		stream = agentv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	task, err := s.getTask(ctx, ns, name)
	if err != nil {
		r.Error(err)
		return
	}
	uid := task.UID
	if o.Follow {
		go s.watchTask(ctx, cancel, ns, name, uid)
	}
	err = s.streamLog(ctx, lr, task, stream, o)
	if err == nil {
		return
	}
	if errors.Is(err, errTaskGone) || errors.Is(context.Cause(ctx), errTaskGone) {
		err = fmt.Errorf("%s of task %s/%s (uid %s) from offset %d: %w", o.Stream, ns, name, uid, lr.offset, errTaskGone)
		if !lr.started {
			r.Error(goneError(err.Error()))
			return
		}
		lr.fail(err.Error())
		return
	}
	if req.Context().Err() != nil {
		return // the client went away
	}
	if !lr.started {
		r.Error(err)
		return
	}
	lr.fail(err.Error())
}

// getTask reads the BashTask from the controller's cache.
func (s *Server) getTask(ctx context.Context, ns, name string) (*bashtaskv1alpha1.BashTask, error) {
	var t bashtaskv1alpha1.BashTask
	err := s.cfg.Tasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
	if apierrors.IsNotFound(err) && s.cfg.LiveTasks != nil {
		// A task created a moment ago may not be in the cache yet.
		err = s.cfg.LiveTasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, apierrors.NewNotFound(bashtaskv1alpha1.GroupVersion.WithResource("bashtasks").GroupResource(), name)
		}
		return nil, apierrors.NewInternalError(err)
	}
	return &t, nil
}

// watchTask cancels a follow with errTaskGone once the task is deleted or
// replaced by one of the same name.
func (s *Server) watchTask(ctx context.Context, cancel context.CancelCauseFunc, ns, name string, uid types.UID) {
	tick := time.NewTicker(taskCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var t bashtaskv1alpha1.BashTask
		err := s.cfg.Tasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
		// A task being deleted is stopped by the controller, so its stream
		// ends on its own, with every byte: only its disappearance ends
		// the follow here.
		if apierrors.IsNotFound(err) || (err == nil && t.UID != uid) {
			cancel(errTaskGone)
			return
		}
	}
}

func finished(t *bashtaskv1alpha1.BashTask) bool { return t.Status.Reason != nil }

func streamStatus(t *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream) *bashtaskv1alpha1.StreamStatus {
	if stream == agentv1.OutputStream_OUTPUT_STREAM_STDERR {
		return t.Status.Stderr
	}
	return t.Status.Stdout
}

// streamLog writes the response: from the agent while it holds the task
// (live, or its spill file after the end), else from the uploaded object,
// else from the status's tail when that is the whole stream. It returns an
// API status error before the headers are written and a plain error after.
func (s *Server) streamLog(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o LogOptions) error {
	for {
		if task.Status.NodeName == nil || *task.Status.NodeName == "" {
			if finished(task) {
				// Never dispatched (refused, cancelled while pending):
				// the streams are empty.
				return s.fromStatus(lr, task, stream, o)
			}
			if !o.Follow {
				if !lr.started {
					lr.start(task.UID, o.Offset, 0, false)
				}
				return nil
			}
			// Not dispatched yet: wait for the node.
			if err := s.waitTask(ctx, &task); err != nil {
				return err
			}
			continue
		}
		node := *task.Status.NodeName
		ended, err := s.fromAgent(ctx, lr, task, node, stream, o, "")
		if err == nil || ended {
			return err
		}
		var se *apierrors.StatusError
		if errors.As(err, &se) {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		// The agent does not hold the task (forgotten) or cannot be
		// reached: a finished task's output is in object storage or in
		// its status; a running one waits for its agent.
		// From kube-apiserver, not the cache: the agent forgets a task
		// once the controller recorded its end and uploads, which the
		// cache may not show yet.
		fresh, gerr := s.refetchLive(ctx, task)
		if gerr != nil {
			return gerr
		}
		task = fresh
		if finished(task) && !errors.Is(err, errAgentBroke) {
			return s.fromStorage(ctx, lr, task, stream, o, err)
		}
		if !o.Follow && !lr.started && status.Code(err) == codes.NotFound {
			// Dispatched (the node is written first) but not started on
			// the agent yet: nothing written so far.
			lr.start(task.UID, lr.offset, 0, false)
			return nil
		}
		if !o.Follow && !lr.started && !finished(task) {
			return apierrors.NewServiceUnavailable(fmt.Sprintf("%s of task %s/%s: %v", o.Stream, task.Namespace, task.Name, err))
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(agentRetryInterval):
		}
		if fresh, gerr = s.refetch(ctx, task); gerr != nil {
			return gerr
		}
		task = fresh
	}
}

// refetchLive is refetch from kube-apiserver when a live reader is set.
func (s *Server) refetchLive(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	if s.cfg.LiveTasks == nil {
		return s.refetch(ctx, task)
	}
	var t bashtaskv1alpha1.BashTask
	err := s.cfg.LiveTasks.Get(ctx, client.ObjectKey{Namespace: task.Namespace, Name: task.Name}, &t)
	if apierrors.IsNotFound(err) || (err == nil && t.UID != task.UID) {
		return nil, errTaskGone
	}
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return &t, nil
}

// refetch reads the task again: errTaskGone when it was deleted or
// re-created under its name.
func (s *Server) refetch(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	t, err := s.getTask(ctx, task.Namespace, task.Name)
	if apierrors.IsNotFound(err) || (err == nil && t.UID != task.UID) {
		return nil, errTaskGone
	}
	return t, err
}

// waitTask waits until the task has a node or has finished.
func (s *Server) waitTask(ctx context.Context, task **bashtaskv1alpha1.BashTask) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
		t, err := s.refetch(ctx, *task)
		if err != nil {
			return err
		}
		if finished(t) || (t.Status.NodeName != nil && *t.Status.NodeName != "") {
			*task = t
			return nil
		}
	}
}

// errAgentBroke marks an agent stream that broke after it began: the agent
// went away (a restart) while it held the task, so it is asked again.
var errAgentBroke = errors.New("the agent's stream broke")

// fromAgent streams from the node's agent: the task's spill file, or with
// objectURL its uploaded copy, which the agent reads from its own bucket.
// ended is true when the response is over (successfully or with an error to
// report); false with an error when another source, or the same agent
// later, should be tried.
func (s *Server) fromAgent(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, node string, stream agentv1.OutputStream, o LogOptions, objectURL string) (ended bool, err error) {
	c, err := s.cfg.Agents.Client(ctx, node)
	if err != nil {
		return false, err
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	rs, err := c.ReadOutput(actx, &agentv1.ReadOutputRequest{
		Uid: string(task.UID), Stream: stream, Offset: lr.offset, Follow: o.Follow, LimitBytes: lr.remaining(),
		ObjectUrl: objectURL,
	})
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

func rangeNotSatisfiable(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusRequestedRangeNotSatisfiable,
		Reason: "RequestedRangeNotSatisfiable", Message: msg,
	}}
}

// fromStatus serves a stream whose status holds it whole: empty, or a
// tail that is neither truncated nor sanitized (so its bytes are the
// stream's).
func (s *Server) fromStatus(lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o LogOptions) error {
	ss := streamStatus(task, stream)
	var data []byte
	if ss != nil && ss.TotalBytes != nil && *ss.TotalBytes > 0 {
		if ss.Tail == nil || (ss.Truncated != nil && *ss.Truncated) || (ss.Sanitized != nil && *ss.Sanitized) ||
			int64(len(*ss.Tail)) != *ss.TotalBytes {
			return errNotKept
		}
		data = []byte(*ss.Tail)
	}
	return serveBytes(lr, task, data, o)
}

var errNotKept = errors.New("no copy is kept")

func serveBytes(lr *logResponse, task *bashtaskv1alpha1.BashTask, data []byte, o LogOptions) error {
	total := int64(len(data))
	if lr.offset > total {
		if lr.started {
			return fmt.Errorf("%s offset %d is past the stream's end at %d bytes", o.Stream, lr.offset, total)
		}
		return rangeNotSatisfiable(fmt.Sprintf("%s offset %d is past the stream's end at %d bytes", o.Stream, lr.offset, total))
	}
	if !lr.started {
		lr.start(task.UID, lr.offset, total, true)
	}
	end := total
	if r := lr.remaining(); r > 0 {
		end = min(end, lr.offset+r)
	}
	if lr.offset < end {
		return lr.write(data[lr.offset:end])
	}
	return nil
}

// fromStorage serves a finished task's stream from the operator's bucket,
// where the agent uploaded it, or from its status. agentErr is why the
// agent could not serve it.
func (s *Server) fromStorage(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o LogOptions, agentErr error) error {
	ss := streamStatus(task, stream)
	gone := func(why string) error {
		msg := fmt.Sprintf("%s of task %s/%s from offset %d cannot be served: %s (the agent: %v)", o.Stream, task.Namespace, task.Name, lr.offset, why, agentErr)
		if lr.started {
			return errors.New(msg)
		}
		return goneError(msg)
	}
	if ss != nil && ss.Parts != nil && ss.Parts.LostFromOffset != nil && lr.offset >= *ss.Parts.LostFromOffset &&
		(ss.Spill == nil || ss.Spill.URL == nil || *ss.Spill.URL == "") {
		// The agent was lost: its total is only what it last reported,
		// and every byte from here on is gone, whether counted or not.
		return gone(lostMessage(task, ss))
	}
	if ss != nil && ss.TotalBytes != nil && lr.offset == *ss.TotalBytes {
		// At the end of the ended stream: nothing to serve, nothing lost
		// (a follower asking whether the stream has ended).
		if !lr.started {
			lr.start(task.UID, lr.offset, *ss.TotalBytes, true)
		}
		return nil
	}
	if ss == nil || ss.Spill == nil || ss.Spill.URL == nil || *ss.Spill.URL == "" {
		if err := s.fromStatus(lr, task, stream, o); !errors.Is(err, errNotKept) {
			return err
		}
		if ss != nil && ss.Parts != nil && ptr.Deref(ss.Parts.KeptBytes, 0) > 0 {
			return s.fromParts(ctx, lr, task, stream, o, ss, gone)
		}
		return gone("the agent no longer holds the stream and no copy was uploaded")
	}
	key, ok := "", false
	if s.bucket != nil {
		key, ok = strings.CutPrefix(*ss.Spill.URL, s.bucketBase+"/")
	}
	if !ok {
		// Not a bucket the controller reads (no --output-bucket-url, or
		// another one, such as the chart's default file:// bucket on the
		// node): a tail that is the whole stream, else the node's agent
		// from its own bucket.
		if err := s.fromStatus(lr, task, stream, o); !errors.Is(err, errNotKept) {
			return err
		}
		return s.fromAgentBucket(ctx, lr, task, stream, o, *ss.Spill.URL, gone)
	}
	total := int64(0)
	if ss.TotalBytes != nil {
		total = *ss.TotalBytes
	}
	objBytes := total
	if ss.Spill.Bytes != nil {
		objBytes = *ss.Spill.Bytes
	}
	if lr.offset > total {
		return rangeNotSatisfiable(fmt.Sprintf("%s offset %d is past the stream's end at %d bytes", o.Stream, lr.offset, total))
	}
	if lr.offset >= objBytes && total > objBytes {
		return gone(fmt.Sprintf("the uploaded copy holds only the first %d bytes of %d (spillLimitBytes)", objBytes, total))
	}
	length := objBytes - lr.offset
	if r := lr.remaining(); r > 0 {
		length = min(length, r)
	}
	if length == 0 {
		// At the end: nothing to read (S3 refuses an empty range).
		if !lr.started {
			lr.start(task.UID, lr.offset, total, true)
		}
		return nil
	}
	rd, err := s.bucket.NewRangeReader(ctx, key, lr.offset, length, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return gone(fmt.Sprintf("the uploaded copy %s is missing", *ss.Spill.URL))
		}
		if lr.started {
			return err
		}
		return apierrors.NewServiceUnavailable(fmt.Sprintf("reading %s: %v", *ss.Spill.URL, err))
	}
	defer rd.Close()
	if !lr.started {
		lr.start(task.UID, lr.offset, total, true)
	}
	buf := make([]byte, 1<<20)
	want := lr.offset + length
	for lr.offset < want {
		n, err := rd.Read(buf[:min(int64(len(buf)), want-lr.offset)])
		if n > 0 {
			if werr := lr.write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("%s from offset %d: reading %s: %w", o.Stream, lr.offset, *ss.Spill.URL, err)
		}
	}
	if lr.offset < want {
		return fmt.Errorf("%s from offset %d: the uploaded copy %s ended early", o.Stream, lr.offset, *ss.Spill.URL)
	}
	if lr.offset == objBytes && total > objBytes && !lr.done() {
		return fmt.Errorf("%s from offset %d is not kept: the uploaded copy holds only the first %d bytes of %d (spillLimitBytes)", o.Stream, lr.offset, objBytes, total)
	}
	return nil
}

// lostMessage says which bytes of a stream whose agent was lost survive.
func lostMessage(task *bashtaskv1alpha1.BashTask, ss *bashtaskv1alpha1.StreamStatus) string {
	kept := ptr.Deref(ss.Parts.KeptBytes, 0)
	return fmt.Sprintf("the bytes from offset %d on are lost: the task ended %s and only its first %d bytes reached object storage, as parts uploaded while it ran",
		ptr.Deref(ss.Parts.LostFromOffset, kept), ptr.Deref(task.Status.Reason, ""), kept)
}

// fromParts serves a finished stream that has no single object but parts
// its agent uploaded while the task ran (the agent was lost before the
// end): the bytes [0, keptBytes) from the parts, in order, through the
// controller's bucket; every byte from keptBytes on is gone. A gap in the
// parts ends the response there: no byte is skipped.
func (s *Server) fromParts(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o LogOptions, ss *bashtaskv1alpha1.StreamStatus, gone func(string) error) error {
	kept := ptr.Deref(ss.Parts.KeptBytes, 0)
	name := "stdout"
	if stream == agentv1.OutputStream_OUTPUT_STREAM_STDERR {
		name = "stderr"
	}
	prefix := outputkey.PartsPrefix(outputkey.Object(task.Namespace, task.Name, string(task.UID), name))
	lost := lostMessage(task, ss)
	if ss.Parts.LostFromOffset == nil {
		lost = fmt.Sprintf("the bytes from offset %d on are not kept: the stream has no uploaded copy and only its first %d bytes reached object storage as parts", kept, kept)
	}
	if lr.offset >= kept {
		return gone(lost)
	}
	if s.bucket == nil {
		return gone(fmt.Sprintf("its first %d bytes are parts under %s in the agents' bucket, which this server does not read (the controller has no --output-bucket-url)", kept, prefix))
	}
	parts, err := outputkey.ListParts(ctx, s.bucket, prefix)
	if err != nil {
		if lr.started {
			return fmt.Errorf("%s from offset %d: listing the parts under %s: %w", o.Stream, lr.offset, prefix, err)
		}
		return apierrors.NewServiceUnavailable(fmt.Sprintf("listing the parts under %s: %v", prefix, err))
	}
	total := max(ptr.Deref(ss.TotalBytes, 0), kept)
	if !lr.started {
		lr.start(task.UID, lr.offset, total, true)
	}
	buf := make([]byte, 1<<20)
	next := int64(0)
	for _, p := range parts {
		if p.Offset >= kept || lr.done() {
			break
		}
		if p.Offset != next {
			return fmt.Errorf("%s from offset %d is not kept: the part at offset %d is missing under %s", o.Stream, lr.offset, next, prefix)
		}
		next = p.End
		end := min(p.End, kept)
		if end <= lr.offset {
			continue
		}
		length := end - lr.offset
		if r := lr.remaining(); r > 0 {
			length = min(length, r)
		}
		rd, err := s.bucket.NewRangeReader(ctx, p.Key, lr.offset-p.Offset, length, nil)
		if err != nil {
			return fmt.Errorf("%s from offset %d: reading the part %s: %w", o.Stream, lr.offset, p.Key, err)
		}
		want := lr.offset + length
		for lr.offset < want {
			n, rerr := rd.Read(buf[:min(int64(len(buf)), want-lr.offset)])
			if n > 0 {
				if werr := lr.write(buf[:n]); werr != nil {
					_ = rd.Close()
					return werr
				}
			}
			if rerr != nil {
				break
			}
		}
		_ = rd.Close()
		if lr.offset < want {
			return fmt.Errorf("%s from offset %d: the part %s ended early", o.Stream, lr.offset, p.Key)
		}
	}
	if lr.done() {
		return nil
	}
	if lr.offset < kept {
		return fmt.Errorf("%s from offset %d is not kept: the part at offset %d is missing under %s", o.Stream, lr.offset, lr.offset, prefix)
	}
	return fmt.Errorf("%s from offset %d: %s", o.Stream, lr.offset, lost)
}

// fromAgentBucket serves a finished task's uploaded copy at objURL through
// the agent of its node, which reads it from its own bucket (ReadOutput
// with object_url): for the copies the controller cannot read itself.
// gone builds the error for bytes that cannot be served.
func (s *Server) fromAgentBucket(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o LogOptions, objURL string, gone func(string) error) error {
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

// goneError is a 410 Gone Status with reason Gone: bytes of the stream
// that are no longer kept anywhere. apierrors.NewGone is deprecated in
// favour of NewResourceExpired, whose reason (Expired) speaks of a watch's
// resourceVersion, not of a stream's bytes.
func goneError(msg string) *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusGone,
		Reason:  metav1.StatusReasonGone,
		Message: msg,
	}}
}
