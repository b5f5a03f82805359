package outputapi

import (
	"context"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// agentLost reports whether the task's agent was lost with a stream that
// has no uploaded copy: its streams and order journal survive only as the
// parts uploaded while it ran.
func agentLost(task *bashtaskv1alpha1.BashTask) bool {
	for _, ss := range []*bashtaskv1alpha1.StreamStatus{task.Status.Stdout, task.Status.Stderr} {
		if ss != nil && ss.Parts != nil && ss.Parts.LostFromOffset != nil && (ss.Spill == nil || ptr.Deref(ss.Spill.URL, "") == "") {
			return true
		}
	}
	return false
}

// partsJournal reads the contiguous prefix of the order journal's parts in
// the controller's bucket, for a task whose agent was lost
// (docs/output.md): the order up to the journal's last part.
func (s *Server) partsJournal(ctx context.Context, task *bashtaskv1alpha1.BashTask, gone func(string) error) ([]byte, error) {
	prefix := outputkey.PartsPrefix(outputkey.Object(task.Namespace, task.Name, string(task.UID), outputorder.Name))
	if s.bucket == nil {
		return nil, gone(fmt.Sprintf("the task ended %s and its order journal survives only as parts under %s in the agents' bucket, which this server does not read (the controller has no --output-bucket-url)",
			ptr.Deref(task.Status.Reason, ""), prefix))
	}
	parts, err := outputkey.ListParts(ctx, s.bucket, prefix)
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("listing the parts under %s: %v", prefix, err))
	}
	var journal []byte
	for _, p := range parts {
		if p.Offset != int64(len(journal)) {
			break // a gap: the order is kept up to it
		}
		b, err := s.bucket.ReadAll(ctx, p.Key)
		if err != nil {
			return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("reading %s: %v", p.Key, err))
		}
		journal = append(journal, b...)
	}
	return journal, nil
}

// partsReader reads a stream's bytes [off, kept) from its parts, in order;
// it ends early at a missing part.
type partsReader struct {
	s      *Server
	ctx    context.Context
	parts  []outputkey.StoredPart
	off    int64
	kept   int64
	prefix string
	rd     io.ReadCloser
	rdEnd  int64
}

// openParts lists a stream's parts and returns a reader from off.
func (s *Server) openParts(ctx context.Context, ss *bashtaskv1alpha1.StreamStatus, key string, off int64) (*partsReader, error) {
	prefix := outputkey.PartsPrefix(key)
	parts, err := outputkey.ListParts(ctx, s.bucket, prefix)
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("listing the parts under %s: %v", prefix, err))
	}
	return &partsReader{s: s, ctx: ctx, parts: parts, off: off, kept: ptr.Deref(ss.Parts.KeptBytes, 0), prefix: prefix}, nil
}

func (r *partsReader) Read(p []byte) (int, error) {
	if r.off >= r.kept {
		return 0, io.EOF
	}
	if r.rd == nil {
		if err := r.open(); err != nil {
			return 0, err
		}
	}
	n, err := r.rd.Read(p[:min(int64(len(p)), r.rdEnd-r.off)])
	r.off += int64(n)
	if r.off >= r.rdEnd || errors.Is(err, io.EOF) {
		_ = r.rd.Close()
		r.rd = nil
		if r.off < r.rdEnd {
			return n, fmt.Errorf("the part ending at %d under %s ended at %d", r.rdEnd, r.prefix, r.off)
		}
		err = nil
	}
	return n, err
}

// open opens the part holding r.off, once the parts before it are
// contiguous from offset 0.
func (r *partsReader) open() error {
	next := int64(0)
	for _, p := range r.parts {
		if p.Offset != next {
			break
		}
		next = p.End
		if p.End <= r.off {
			continue
		}
		r.rdEnd = min(p.End, r.kept)
		rd, err := r.s.bucket.NewRangeReader(r.ctx, p.Key, r.off-p.Offset, r.rdEnd-r.off, nil)
		if err != nil {
			return fmt.Errorf("reading the part %s: %w", p.Key, err)
		}
		r.rd = rd
		return nil
	}
	return fmt.Errorf("the part at offset %d is missing under %s", next, r.prefix)
}

func (r *partsReader) Close() error {
	if r.rd != nil {
		return r.rd.Close()
	}
	return nil
}
