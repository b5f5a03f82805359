package agent

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"

	"gocloud.dev/gcerrors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// readObject serves ReadOutput with object_url (or object_key, the same
// URL without the bucket's): the stream's uploaded copy,
// read through the agent's bucket handle with range reads, for a task the
// agent may no longer hold. The controller asks for it when it cannot read
// the bucket itself, as with the chart's default file:// bucket on the
// node. The URL only selects a key: the key is checked to be the layout
// the agent uploads to, for the request's uid and stream, and nothing of
// the request ever becomes a local path.
func (s *Server) readObject(req *agentv1.ReadOutputRequest, name string, srv agentv1.Executor_ReadOutputServer) error {
	ctx := srv.Context()
	objURL, offset, limit := req.GetObjectUrl(), req.GetOffset(), req.GetLimitBytes()
	if objURL == "" {
		objURL = s.bucketBase + "/" + req.GetObjectKey()
	}
	key, err := s.uploadedKey(objURL, req.GetUid(), name)
	if err != nil {
		return err
	}
	attrs, err := s.bucket.Attributes(ctx, key)
	if err != nil {
		return objectError(name, offset, objURL, err)
	}
	size := attrs.Size
	total := size
	// The agent wrote the metadata with the object (put); an object
	// without it is taken as the whole stream.
	if v, ok := attrs.Metadata[MetaBytes]; ok {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n != size {
			return status.Errorf(codes.DataLoss, "%s from offset %d: the uploaded copy %s holds %d bytes, its metadata says %q", name, offset, objURL, size, v)
		}
	}
	if v, ok := attrs.Metadata[MetaStreamBytes]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < size {
			return status.Errorf(codes.DataLoss, "%s from offset %d: the uploaded copy %s holds %d bytes, its metadata says the stream had %q", name, offset, objURL, size, v)
		}
		total = n
	}
	if err := checkObjectRange(name, objURL, size, total, offset); err != nil {
		return err
	}
	st := &agentv1.OutputState{TotalBytes: total, Complete: true, SpillBytes: size}
	if err := srv.Send(&agentv1.OutputChunk{Offset: offset, Header: st}); err != nil {
		return err
	}
	length := size - offset
	if limit > 0 {
		length = min(length, limit)
	}
	if length > 0 {
		if offset, err = s.sendObjectRange(srv, name, objURL, key, offset, length); err != nil {
			return err
		}
	}
	if limit <= 0 || length < limit {
		// Every byte kept was sent; bytes past them are lost.
		if err := checkObjectRange(name, objURL, size, total, offset); err != nil {
			return err
		}
	}
	return srv.Send(&agentv1.OutputChunk{Offset: offset, End: st})
}

// sendObjectRange sends length bytes of the object from offset in chunks of
// OutputChunkBytes and returns the offset after them.
func (s *Server) sendObjectRange(srv agentv1.Executor_ReadOutputServer, name, objURL, key string, offset, length int64) (int64, error) {
	rd, err := s.bucket.NewRangeReader(srv.Context(), key, offset, length, nil)
	if err != nil {
		return offset, objectError(name, offset, objURL, err)
	}
	defer rd.Close()
	buf := make([]byte, min(length, OutputChunkBytes))
	for end := offset + length; offset < end; {
		n, err := io.ReadFull(rd, buf[:min(int64(len(buf)), end-offset)])
		if n > 0 {
			if err := srv.Send(&agentv1.OutputChunk{Offset: offset, Data: buf[:n]}); err != nil {
				return offset, err
			}
			offset += int64(n)
		}
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return offset, status.Errorf(codes.DataLoss, "%s from offset %d: the uploaded copy %s ended before its size of %d bytes", name, offset, objURL, end)
		case err != nil:
			return offset, objectError(name, offset, objURL, err)
		}
	}
	return offset, nil
}

// uploadedKey returns the bucket key of objURL when it is an object of this
// agent's bucket with the key layout of uploads (ObjectKey) for uid and
// stream: FAILED_PRECONDITION for another bucket, INVALID_ARGUMENT for
// another key.
func (s *Server) uploadedKey(objURL, uid, stream string) (string, error) {
	key, ok := strings.CutPrefix(objURL, s.bucketBase+"/")
	if !ok {
		return "", status.Errorf(codes.FailedPrecondition, "object_url %q is not in this agent's bucket %s", objURL, s.bucketBase)
	}
	parts := strings.Split(key, "/")
	if len(parts) != 4 || !validObjectName(parts[0]) || !validObjectName(parts[1]) || parts[2] != uid || parts[3] != stream ||
		ObjectKey(&agentv1.TaskRef{Namespace: parts[0], Name: parts[1], Uid: uid}, stream) != key {
		return "", status.Errorf(codes.InvalidArgument, "object_url %q: the key must be <namespace>/<name>/%s/%s in %s", objURL, uid, stream, s.bucketBase)
	}
	return key, nil
}

// checkObjectRange is checkOutputRange for an uploaded copy of size bytes
// of a stream of total bytes.
func checkObjectRange(name, objURL string, size, total, offset int64) error {
	if offset >= size && total > size {
		return status.Errorf(codes.DataLoss, "%s from offset %d is not kept: the uploaded copy %s holds only the first %d bytes of %d (spillLimitBytes)", name, offset, objURL, size, total)
	}
	if offset > total {
		return status.Errorf(codes.OutOfRange, "%s offset %d is past the stream's end at %d bytes", name, offset, total)
	}
	return nil
}

// objectError maps a bucket error: NOT_FOUND for a missing object (the
// controller reports the copy lost), UNAVAILABLE for anything else (the
// bucket may answer later).
func objectError(name string, offset int64, objURL string, err error) error {
	if gcerrors.Code(err) == gcerrors.NotFound {
		return status.Errorf(codes.NotFound, "%s from offset %d: the uploaded copy %s is missing", name, offset, objURL)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Unavailable, "%s from offset %d: reading the uploaded copy %s: %v", name, offset, objURL, err)
}
