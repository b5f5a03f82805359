package outputapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/gcerrors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// combinedFromStorage serves stream=all of a finished task its agent no
// longer holds (docs/output.md, "stdout and stderr in one stream"): the
// order journal uploaded beside the streams (none is needed when a stream
// is empty), and each stream from its status tail when that is the whole
// stream, else its uploaded copy, read as fromStorage reads it. Each
// stream is read once, in order, from the first of its bytes the framed
// offset needs. agentErr is why the agent could not serve it.
func (s *Server) combinedFromStorage(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, agentErr error) error {
	gone := func(why string) error {
		msg := fmt.Sprintf("stdout and stderr of task %s/%s from offset %d cannot be served: %s", task.Namespace, task.Name, lr.offset, why)
		if agentErr != nil {
			msg += fmt.Sprintf(" (the agent: %v)", agentErr)
		}
		if lr.started {
			return errors.New(msg)
		}
		return goneError(msg)
	}
	recs, lost, err := s.combinedRecords(ctx, task, gone)
	if err != nil {
		return err
	}
	known := int64(0)
	for _, r := range recs {
		known += outputorder.FramedLen(r)
	}
	lostMsg := fmt.Sprintf("the bytes from offset %d on are lost: the task ended %s and its order journal reached object storage only up to there, as parts uploaded while it ran",
		known, ptr.Deref(task.Status.Reason, ""))
	if lost && lr.offset >= known {
		return gone(lostMsg)
	}
	if lr.offset > known {
		msg := fmt.Sprintf("stdout and stderr: offset %d is past the framed stream's end at %d bytes", lr.offset, known)
		if lr.started {
			return errors.New(msg)
		}
		return rangeNotSatisfiable(msg)
	}
	readers, err := s.openStoredStreams(ctx, task, recs, lr.offset, gone)
	defer func() {
		for _, r := range readers {
			if r != nil {
				_ = r.Close()
			}
		}
	}()
	if err != nil {
		return err
	}
	if !lr.started {
		lr.start(task.UID, lr.offset, known, true)
	}
	w := &framedWriter{lr: lr, limit: lr.remaining(), readers: readers}
	from := lr.offset
	var c outputorder.Cursor
	for _, r := range recs {
		if err := c.Walk(r, from, w.emit); err != nil {
			if errors.Is(err, errFramedLimit) {
				return w.flush()
			}
			return errors.Join(w.flush(), err)
		}
	}
	if err := w.flush(); err != nil || !lost {
		return err
	}
	return gone(lostMsg)
}

// errNoJournal is a one-stream task's missing order journal: its bytes
// are then one run.
var errNoJournal = errors.New("no order journal")

// combinedRecords returns the task's framed stream as records: its order
// journal's, then the bytes no record holds (outputorder.Rest). For a task
// whose agent was lost (lost true) only the records of the journal's parts:
// the order of the bytes after them is not known.
func (s *Server) combinedRecords(ctx context.Context, task *bashtaskv1alpha1.BashTask, gone func(string) error) (recs []outputorder.Record, lost bool, err error) {
	total := [3]int64{0, streamTotal(task.Status.Stdout), streamTotal(task.Status.Stderr)}
	lost = agentLost(task)
	var journal []byte
	switch {
	case lost:
		journal, err = s.partsJournal(ctx, task, gone)
	case total[outputorder.Stdout] == 0 || total[outputorder.Stderr] == 0:
		// One stream (or none). Its journal, when the agent wrote one,
		// has the records a follower was served frames of while the task
		// ran (a follower seals the run being read): framed again without
		// them, a resumed read's offset would land elsewhere. Without a
		// journal the bytes are one run.
		journal, err = s.orderJournal(ctx, task, func(string) error { return errNoJournal })
		if errors.Is(err, errNoJournal) {
			journal, err = nil, nil
		}
	default:
		journal, err = s.orderJournal(ctx, task, gone)
	}
	if err != nil {
		return nil, lost, err
	}
	var p outputorder.Parser
	if err := p.Feed(journal, func(r outputorder.Record) error { recs = append(recs, r); return nil }); err != nil {
		return nil, lost, gone(fmt.Sprintf("its order journal cannot be read: %v", err))
	}
	if lost {
		if len(recs) == 0 && (total[outputorder.Stdout] == 0 || total[outputorder.Stderr] == 0) {
			// One stream: no journal was kept, nor needed, for its
			// parts.
			kept := [3]int64{0, partsKept(task.Status.Stdout), partsKept(task.Status.Stderr)}
			recs = outputorder.Rest([3]int64{}, kept)
		}
		return recs, true, nil
	}
	return append(recs, outputorder.Rest(p.Sums, total)...), false, nil
}

func partsKept(ss *bashtaskv1alpha1.StreamStatus) int64 {
	if ss == nil || ss.Parts == nil {
		return 0
	}
	return ptr.Deref(ss.Parts.KeptBytes, 0)
}

func streamTotal(ss *bashtaskv1alpha1.StreamStatus) int64 {
	if ss == nil {
		return 0
	}
	return ptr.Deref(ss.TotalBytes, 0)
}

// orderJournal reads the task's uploaded order journal: from the
// controller's bucket, else through its node's agent from the agent's own
// bucket (ReadOutput with object_key).
func (s *Server) orderJournal(ctx context.Context, task *bashtaskv1alpha1.BashTask, gone func(string) error) ([]byte, error) {
	key := outputkey.Object(task.Namespace, task.Name, string(task.UID), outputorder.Name)
	if s.bucket != nil {
		b, err := s.bucket.ReadAll(ctx, key)
		if err == nil {
			return b, nil
		}
		if gcerrors.Code(err) != gcerrors.NotFound {
			return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("reading the order journal %s/%s: %v", s.bucketBase, key, err))
		}
	}
	node := ptr.Deref(task.Status.NodeName, "")
	if node == "" {
		return nil, gone("the order of its streams was not kept: no order journal was uploaded")
	}
	rd, err := s.agentObject(ctx, task, node, agentv1.OutputStream_OUTPUT_STREAM_ORDER, &agentv1.ReadOutputRequest{ObjectKey: key}, 0)
	if err != nil {
		return nil, agentObjectError(err, fmt.Sprintf("the order journal %s", key), node, gone)
	}
	defer rd.Close()
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("reading the order journal %s through the agent of node %s: %v", key, node, err))
	}
	return b, nil
}

// agentObjectError maps the error of an uploaded copy read through an
// agent: gone for a copy missing or refused, 503 otherwise.
func agentObjectError(err error, what, node string, gone func(string) error) error {
	switch status.Code(err) {
	case codes.NotFound:
		return gone(fmt.Sprintf("%s is not kept: %s", what, status.Convert(err).Message()))
	case codes.FailedPrecondition, codes.InvalidArgument:
		return gone(fmt.Sprintf("the agent of node %s does not serve %s: %s", node, what, status.Convert(err).Message()))
	}
	return apierrors.NewServiceUnavailable(fmt.Sprintf("reading %s through the agent of node %s: %v", what, node, err))
}

// openStoredStreams opens, for each stream the framed stream from offset
// on needs, a reader of its bytes from the first one needed.
func (s *Server) openStoredStreams(ctx context.Context, task *bashtaskv1alpha1.BashTask, recs []outputorder.Record, offset int64, gone func(string) error) ([3]io.ReadCloser, error) {
	first := [3]int64{-1, -1, -1}
	var c outputorder.Cursor
	for _, r := range recs {
		_ = c.Walk(r, offset, func(p outputorder.Piece) error {
			if len(p.Header) == 0 && first[p.Stream] < 0 {
				first[p.Stream] = p.Offset
			}
			return nil
		})
	}
	var out [3]io.ReadCloser
	for _, id := range []byte{outputorder.Stdout, outputorder.Stderr} {
		if first[id] < 0 {
			continue
		}
		rd, err := s.openStored(ctx, task, id, first[id], gone)
		if err != nil {
			return out, err
		}
		out[id] = rd
	}
	return out, nil
}

// openStored returns a reader of stream id's stored bytes from off: its
// status tail when that is the whole stream, else its uploaded copy from
// the controller's bucket or through its node's agent. The reader ends
// where the copy does; bytes past a copy cut at spillLimitBytes are not
// kept. Parts of a task whose agent was lost are not framed.
func (s *Server) openStored(ctx context.Context, task *bashtaskv1alpha1.BashTask, id byte, off int64, gone func(string) error) (io.ReadCloser, error) {
	name, ss, stream := "stdout", task.Status.Stdout, agentv1.OutputStream_OUTPUT_STREAM_STDOUT
	if id == outputorder.Stderr {
		name, ss, stream = "stderr", task.Status.Stderr, agentv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	if ss != nil && ss.Tail != nil && !ptr.Deref(ss.Truncated, false) && !ptr.Deref(ss.Sanitized, false) &&
		int64(len(*ss.Tail)) == streamTotal(ss) {
		return io.NopCloser(strings.NewReader((*ss.Tail)[off:])), nil
	}
	if ss == nil || ss.Spill == nil || ptr.Deref(ss.Spill.URL, "") == "" {
		if ss != nil && ss.Parts != nil && ptr.Deref(ss.Parts.KeptBytes, 0) > off && s.bucket != nil {
			return s.openParts(ctx, ss, outputkey.Object(task.Namespace, task.Name, string(task.UID), name), off)
		}
		return nil, gone(fmt.Sprintf("%s from its offset %d is not kept: it has no uploaded copy", name, off))
	}
	url := *ss.Spill.URL
	objBytes := ptr.Deref(ss.Spill.Bytes, streamTotal(ss))
	if off >= objBytes {
		return nil, gone(fmt.Sprintf("%s from its offset %d is not kept: the uploaded copy holds only the first %d bytes of %d (spillLimitBytes)", name, off, objBytes, streamTotal(ss)))
	}
	if key, ok := strings.CutPrefix(url, s.bucketBase+"/"); s.bucket != nil && ok {
		rd, err := s.bucket.NewRangeReader(ctx, key, off, objBytes-off, nil)
		switch {
		case gcerrors.Code(err) == gcerrors.NotFound:
			return nil, gone(fmt.Sprintf("the uploaded copy %s is missing", url))
		case err != nil:
			return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("reading %s: %v", url, err))
		}
		return rd, nil
	}
	node := ptr.Deref(task.Status.NodeName, "")
	if node == "" {
		return nil, gone(fmt.Sprintf("the uploaded copy %s is not in the controller's bucket and the task has no node whose agent could read it", url))
	}
	rd, err := s.agentObject(ctx, task, node, stream, &agentv1.ReadOutputRequest{ObjectUrl: url}, off)
	if err != nil {
		return nil, agentObjectError(err, "the uploaded copy "+url, node, gone)
	}
	return rd, nil
}

// agentObject opens ReadOutput of an uploaded copy (req's object_url or
// object_key) through the node's agent from off and returns its data as a
// reader, once the agent answered its header.
func (s *Server) agentObject(ctx context.Context, task *bashtaskv1alpha1.BashTask, node string, stream agentv1.OutputStream, req *agentv1.ReadOutputRequest, off int64) (io.ReadCloser, error) {
	c, err := s.cfg.Agents.Client(ctx, node)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(ctx)
	req.Uid, req.Stream, req.Offset = string(task.UID), stream, off
	rs, err := c.ReadOutput(actx, req)
	if err == nil {
		_, err = rs.Recv() // the header, or the refusal
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &agentObjectReader{rs: rs, cancel: cancel}, nil
}

// agentObjectReader is the data of a ReadOutput stream as an io.Reader: EOF
// at its end message.
type agentObjectReader struct {
	rs     agentv1.Executor_ReadOutputClient
	cancel context.CancelFunc
	buf    []byte
	ended  bool
}

func (r *agentObjectReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.ended {
			return 0, io.EOF
		}
		m, err := r.rs.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, errors.New(status.Convert(err).Message())
		}
		r.buf, r.ended = m.GetData(), m.GetEnd() != nil
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *agentObjectReader) Close() error { r.cancel(); return nil }

// errFramedLimit stops a walk at the request's limitBytes.
var errFramedLimit = errors.New("limitBytes reached")

// framedWriter writes the framed stream's pieces to a response, gathered
// into writes of up to 1 MiB: a frame's header is not a flush of its own.
type framedWriter struct {
	lr      *logResponse
	limit   int64 // 0: none
	readers [3]io.ReadCloser
	buf     bytes.Buffer
	written int64
}

func (w *framedWriter) emit(p outputorder.Piece) error {
	if len(p.Header) > 0 {
		return w.gather(int64(len(p.Header)), bytes.NewReader(p.Header), "")
	}
	name := "stdout"
	if p.Stream == outputorder.Stderr {
		name = "stderr"
	}
	return w.gather(p.Len, w.readers[p.Stream], fmt.Sprintf("%s from its offset %d", name, p.Offset))
}

// gather copies n bytes of r, cut at the limit; what names r's bytes in
// the error of a copy that ends early.
func (w *framedWriter) gather(n int64, r io.Reader, what string) error {
	if w.limit > 0 {
		if w.written >= w.limit {
			return errFramedLimit
		}
		n = min(n, w.limit-w.written)
	}
	for n > 0 {
		k := min(n, int64(1<<20-w.buf.Len()))
		got, err := io.CopyN(&w.buf, r, k)
		w.written += got
		n -= got
		if w.buf.Len() >= 1<<20 {
			if ferr := w.flush(); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the copy kept ends there (spillLimitBytes, or the parts of a lost agent)")
			}
			return fmt.Errorf("stdout and stderr from offset %d: %s is not kept: %w", w.lr.offset+int64(w.buf.Len()), what, err)
		}
	}
	return nil
}

func (w *framedWriter) flush() error {
	if w.buf.Len() == 0 {
		return nil
	}
	err := w.lr.write(w.buf.Bytes())
	w.buf.Reset()
	return err
}
