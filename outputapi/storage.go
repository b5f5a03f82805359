package outputapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/gcerrors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
)

// fromStatus serves a stream whose status holds it whole: empty, or a
// tail that is neither truncated nor sanitized (so its bytes are the
// stream's).
func (s *Server) fromStatus(lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o outputv1alpha1.LogOptions) error {
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

func serveBytes(lr *logResponse, task *bashtaskv1alpha1.BashTask, data []byte, o outputv1alpha1.LogOptions) error {
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
func (s *Server) fromStorage(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o outputv1alpha1.LogOptions, agentErr error) error {
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
	return s.fromBucket(ctx, lr, task, o, ss, key, gone)

}

// fromBucket serves lr from the task's uploaded copy of the stream, the
// object key in the controller's bucket, up to the stream's total (the
// copy may hold only its first spillLimitBytes). gone makes the error for
// bytes that can no longer be served.
func (s *Server) fromBucket(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, o outputv1alpha1.LogOptions, ss *bashtaskv1alpha1.StreamStatus, key string, gone func(string) error) error {
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
func (s *Server) fromParts(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o outputv1alpha1.LogOptions, ss *bashtaskv1alpha1.StreamStatus, gone func(string) error) error {
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
