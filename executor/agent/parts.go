package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
)

// Defaults of the part uploads (docs/output.md, "Output that survives the
// node").
const (
	// DefaultPartBytes is the largest part, 8 MiB: 128 PUTs per GiB of a
	// fast stream, and at most this much of it lost with the node beyond
	// the interval's worth.
	DefaultPartBytes = 8 << 20
	// DefaultPartInterval is the longest a stream's new bytes wait for a
	// part: a slow stream loses at most this much time's output with its
	// node.
	DefaultPartInterval = 10 * time.Second
	// MinPartBytes is the smallest --output-part-bytes, 64 KiB: smaller
	// parts cost a request each for a few bytes.
	MinPartBytes = 64 << 10
	// MinPartInterval is the smallest --output-part-interval.
	MinPartInterval = time.Second
)

// MetaOffset is the part's first byte's offset in the stream (object
// metadata of a part; the key says it too).
const MetaOffset = "offset"

// PartsPrefix is the key prefix of a stream's parts:
// <namespace>/<name>/<uid>/<stream>.parts/ (outputkey.PartsPrefix).
func PartsPrefix(ref *agentv1.TaskRef, stream string) string {
	return outputkey.PartsPrefix(ObjectKey(ref, stream))
}

// partState is one stream's part uploads while its task runs, under s.mu.
// Parts are uploaded in order, one at a time per stream, so kept is always
// the end of a contiguous prefix: a part that fails is tried again (with
// backoff) before any byte after it.
type partState struct {
	kept     int64     // bytes [0, kept) are in the bucket
	last     time.Time // the last part's upload, or when the stream was first seen
	failures int       // consecutive failures of the part at kept
	next     time.Time // earliest next attempt after a failure
	inFlight bool
}

// partJob is one part to upload, taken out of the lock.
type partJob struct {
	e          *entry
	stream     int
	key        string
	path       string
	start, end int64
}

// partsTick is how often the part loop looks at the running tasks: a
// tenth of the interval (within 50 ms to 1 s), so a part is at most that
// late. A look reads each stream's published size under its mutex, which
// the executor's reader takes once per chunk anyway.
func (s *Server) partsTick() time.Duration {
	return min(max(s.cfg.PartInterval/10, 50*time.Millisecond), time.Second)
}

// partsLoop uploads the parts of running tasks until ctx ends. One part at
// a time: it bounds the agent's memory (one copy buffer and the bucket
// driver's) and network use, and it reads the spill file, never the
// command's pipe, so a slow or failing bucket never holds the command up.
func (s *Server) partsLoop(ctx context.Context) {
	t := time.NewTicker(s.partsTick())
	defer t.Stop()
	for {
		for _, j := range s.duePartsLocking() {
			if ctx.Err() != nil {
				s.releaseParts(j)
				continue
			}
			s.uploadPart(ctx, j)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// releaseParts clears the in-flight mark of a job never attempted.
func (s *Server) releaseParts(j partJob) {
	s.mu.Lock()
	j.e.parts[j.stream].inFlight = false
	s.mu.Unlock()
}

// duePartsLocking returns the parts due now (marked in flight): for each
// stream of a running task that goes to the bucket (its policy is not
// NEVER) and is longer than the status tail keeps, the next bytes of its
// spill file once PartBytes have accumulated or PartInterval has passed
// since the last part.
func (s *Server) duePartsLocking() []partJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.PartBytes <= 0 {
		return nil
	}
	now := time.Now()
	var jobs []partJob
	for _, uid := range s.sortedUIDsLocked() {
		e := s.tasks[uid]
		if e.task == nil || e.status.State != agentv1.TaskState_TASK_STATE_RUNNING || e.rec.Upload == agentv1.UploadPolicy_UPLOAD_POLICY_NEVER {
			continue
		}
		for i := range e.parts {
			ps := &e.parts[i]
			if ps.last.IsZero() {
				ps.last = now
			}
			if ps.inFlight || now.Before(ps.next) {
				continue
			}
			path, avail, ok := s.partSourceLocked(e, i, now)
			if !ok || avail <= ps.kept {
				continue
			}
			n := avail - ps.kept
			if n < s.cfg.PartBytes && now.Sub(ps.last) < s.cfg.PartInterval {
				continue
			}
			n = min(n, s.cfg.PartBytes)
			ps.inFlight = true
			jobs = append(jobs, partJob{
				e: e, stream: i, path: path, start: ps.kept, end: ps.kept + n,
				key: outputkey.Part(PartsPrefix(e.status.GetRef(), uploadNames[i]), ps.kept),
			})
		}
	}
	return jobs
}

// partSourceLocked returns the file behind upload i of a running task and
// how many of its bytes are final, or false while it needs no parts: a
// stream while the status tail holds it whole; the order journal while a
// stream of the task is empty (the task then needs no journal) or the
// tail holds both. The journal's run being read becomes a record once a
// part interval has passed since its last part, so the journal's parts
// keep the order up to that moment (docs/output.md).
func (s *Server) partSourceLocked(e *entry, i int, now time.Time) (string, int64, bool) {
	if i < 2 {
		st, _ := e.task.Output(i == 1)
		return st.SpillPath, st.SpillBytes, st.TotalBytes > int64(e.rec.TailBytes)
	}
	out, _ := e.task.Output(false)
	errs, _ := e.task.Output(true)
	if out.TotalBytes == 0 || errs.TotalBytes == 0 || max(out.TotalBytes, errs.TotalBytes) <= int64(e.rec.TailBytes) {
		return "", 0, false
	}
	o := e.task.Order(now.Sub(e.parts[i].last) >= s.cfg.PartInterval)
	return o.Path, o.Bytes, true
}

// uploadPart makes one attempt at a part and records its outcome.
func (s *Server) uploadPart(ctx context.Context, j partJob) {
	actx, cancel := context.WithTimeout(ctx, s.partTimeout())
	err := s.putPart(actx, j)
	cancel()
	s.mu.Lock()
	ps := &j.e.parts[j.stream]
	ps.inFlight = false
	uid := j.e.status.GetRef().GetUid()
	if err != nil {
		defer s.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		ps.failures++
		ps.next = time.Now().Add(s.backoff(ps.failures))
		s.metrics.Uploads.WithLabelValues("part_failure").Inc()
		s.log.Warn("part upload failed; retrying it before any later byte", "uid", uid, "key", j.key,
			"attempt", ps.failures, "retryIn", time.Until(ps.next).Round(time.Millisecond), "err", err)
		return
	}
	ps.kept, ps.last, ps.failures, ps.next = j.end, time.Now(), 0, time.Time{}
	s.metrics.Uploads.WithLabelValues("part_success").Inc()
	// The stream's object may have been stored while this part was in
	// flight (the object's upload does not wait for it). Its deletion of
	// the parts lists them only after the object is marked uploaded, so a
	// part that sees no mark here is in that listing, and one that sees
	// it deletes itself.
	superseded := j.e.stream(j.stream).GetSpill().GetUploadState() == agentv1.UploadState_UPLOAD_STATE_UPLOADED
	s.mu.Unlock()
	s.log.Debug("uploaded part", "uid", uid, "key", j.key, "bytes", j.end-j.start)
	if superseded {
		if err := s.bucket.Delete(ctx, j.key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			s.log.Warn("deleting a part its stream's object superseded", "uid", uid, "key", j.key, "err", err)
		}
	}
}

// partTimeout bounds one part's attempt: long enough for PartBytes on a
// slow link, short enough that a hung store does not hold the other
// tasks' parts for the whole upload timeout.
func (s *Server) partTimeout() time.Duration {
	return min(s.cfg.UploadTimeout, max(2*time.Minute, 4*s.cfg.PartInterval))
}

// putPart copies bytes [start, end) of the spill file to the part's key,
// with its checksum, size and offset as metadata. Those bytes are final:
// the spill file is append-only and the executor publishes a size only
// after writing the bytes. As for the final object, the part counts only
// once Close returned nil and the stored object has the part's size.
func (s *Server) putPart(ctx context.Context, j partJob) error {
	f, err := os.Open(j.path)
	if err != nil {
		return fmt.Errorf("opening spill file: %w", err)
	}
	defer f.Close()
	n := j.end - j.start
	h := sha256.New()
	if got, err := io.Copy(h, io.NewSectionReader(f, j.start, n)); err != nil || got != n {
		return fmt.Errorf("reading bytes %d to %d of spill file %s: %d read: %w", j.start, j.end, j.path, got, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.bucket.NewWriter(wctx, j.key, &blob.WriterOptions{
		ContentType: "application/octet-stream",
		// One buffer of the part's size: the driver sends the part in one
		// request (S3 would otherwise split a part over its 5 MiB default
		// into a multipart upload of four requests), and the agent holds
		// at most PartBytes of it in memory, one part at a time.
		BufferSize: int(n),
		Metadata: map[string]string{
			MetaSHA256: hex.EncodeToString(h.Sum(nil)),
			MetaBytes:  strconv.FormatInt(n, 10),
			MetaOffset: strconv.FormatInt(j.start, 10),
		},
	})
	if err != nil {
		return fmt.Errorf("uploading %s: %w", j.key, err)
	}
	written, err := io.Copy(w, io.NewSectionReader(f, j.start, n))
	if err == nil && written != n {
		err = fmt.Errorf("wrote %d of the part's %d bytes", written, n)
	}
	if err != nil {
		cancel() // aborts the write: no partial object
		return errors.Join(fmt.Errorf("uploading %s: %w", j.key, err), w.Close())
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("uploading %s: closing the object writer: %w", j.key, err)
	}
	attrs, err := s.bucket.Attributes(ctx, j.key)
	switch {
	case gcerrors.Code(err) == gcerrors.PermissionDenied:
	case err != nil:
		return fmt.Errorf("checking %s after the upload: %w", j.key, err)
	case attrs.Size != n:
		return fmt.Errorf("part %s holds %d bytes after the upload, want %d", j.key, attrs.Size, n)
	}
	return nil
}

// keptLocked returns the bytes of stream i kept as parts.
func (e *entry) keptLocked(i int) int64 { return e.parts[i].kept }

// setKeptLocked copies the kept byte counts into the task's status, which
// progress events and the finished status carry to the controller.
func (e *entry) setKeptLocked() {
	if ss := e.status.GetStdout(); ss != nil {
		ss.KeptBytes = e.parts[0].kept
	}
	if ss := e.status.GetStderr(); ss != nil {
		ss.KeptBytes = e.parts[1].kept
	}
}

// deleteParts removes every part under prefix, once the stream's single
// object holds all their bytes. It lists the bucket instead of trusting
// memory, so parts of an earlier incarnation go too. Errors are returned
// joined; the caller keeps going, since the parts only cost storage.
func (s *Server) deleteParts(ctx context.Context, prefix string) (int, error) {
	parts, err := outputkey.ListParts(ctx, s.bucket, prefix)
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("listing %s: %w", prefix, err))
	}
	n := 0
	for _, p := range parts {
		if err := s.bucket.Delete(ctx, p.Key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			errs = append(errs, fmt.Errorf("deleting %s: %w", p.Key, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
