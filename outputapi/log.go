package outputapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/taskrecord"
)

// logREST serves bashtasks/log as a rest.Connecter: the REST machinery
// authenticates, authorizes (get on bashtasks/log of output.bashtask.dev),
// decodes LogOptions and then hands over the ResponseWriter, which the
// response needs for its headers and trailers. A rest.ResourceStreamer
// would only get to return a body: no response headers, no trailers.
type logREST struct {
	subresource
	s *Server
}

var (
	_ rest.Connecter            = (*logREST)(nil)
	_ rest.Storage              = (*logREST)(nil)
	_ rest.Scoper               = (*logREST)(nil)
	_ rest.SingularNameProvider = (*logREST)(nil)
)

// Connect implements rest.Connecter.
func (l *logREST) Connect(ctx context.Context, name string, opts runtime.Object, r rest.Responder) (http.Handler, error) {
	o, ok := opts.(*outputv1alpha1.LogOptions)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected options %T", opts))
	}
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		l.s.serveLog(w, req, r, ns, name, *o)
	}), nil
}

// serveLog answers one bashtasks/log request (docs/output.md).
func (s *Server) serveLog(w http.ResponseWriter, req *http.Request, r rest.Responder, ns, name string, o outputv1alpha1.LogOptions) {
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	lr := &logResponse{w: w, rc: http.NewResponseController(w), offset: o.Offset, limit: o.LimitBytes}
	stream := agentv1.OutputStream_OUTPUT_STREAM_STDOUT
	if o.Stream == "stderr" {
		stream = agentv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	task, recorded, err := s.lookupTask(ctx, ns, name, types.UID(o.UID))
	if err != nil {
		r.Error(err)
		return
	}
	uid := task.UID
	if recorded {
		err = s.recordedLog(ctx, lr, task, stream, o)
	} else {
		if o.Follow {
			go s.watchTask(ctx, cancel, ns, name, uid)
		}
		err = s.streamLog(ctx, lr, task, stream, o)
		if errors.Is(err, errTaskGone) && !lr.started && s.bucket != nil && req.Context().Err() == nil {
			// The task was deleted between the lookup (a cache may lag)
			// and the read: serve it from the record the controller kept
			// of it, as a lookup a moment later would have.
			if rec, rerr := taskrecord.Read(req.Context(), s.bucket, ns, name, uid); rerr == nil {
				err = s.recordedLog(req.Context(), lr, rec, stream, o)
			}
		}
	}
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
