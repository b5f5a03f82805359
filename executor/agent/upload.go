package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// Object metadata keys set on every upload.
const (
	// MetaSHA256 is the hex SHA-256 of the object's bytes.
	MetaSHA256 = "sha256"
	// MetaBytes is the object's size in bytes.
	MetaBytes = "bytes"
	// MetaStreamBytes is the stream's total size in bytes; larger than
	// MetaBytes when the spill file hit its limit.
	MetaStreamBytes = "stream-bytes"
	// MetaComplete is "true" when the object holds the whole stream.
	MetaComplete = "complete"
)

// ObjectKey is the key of a task's stream in the bucket (docs/agent.md,
// "Uploads"): <namespace>/<name>/<uid>/<stream>.
func ObjectKey(ref *agentv1.TaskRef, stream string) string {
	return outputkey.Object(ref.GetNamespace(), ref.GetName(), ref.GetUid(), stream)
}

// uploadNames are the objects a task may upload, in the order of
// entry.uploads: its streams, then its order journal.
var uploadNames = [3]string{streamNames[0], streamNames[1], outputorder.Name}

// stream returns the status of upload i: stdout, stderr or the order
// journal.
func (e *entry) stream(i int) *agentv1.StreamStatus {
	return statusOf(e.status, i)
}

func statusOf(st *agentv1.TaskStatus, i int) *agentv1.StreamStatus {
	switch i {
	case 0:
		return st.GetStdout()
	case 1:
		return st.GetStderr()
	}
	return st.GetOrder()
}

func (e *entry) pendingUploads() int {
	n := 0
	for _, j := range e.uploads {
		if j != nil {
			n++
		}
	}
	return n
}

// planUploadsLocked decides which streams of a finished task go to the
// bucket: under WHEN_INCOMPLETE those whose tail is not the exact stream
// (truncated, sanitized or beyond the spill file), every stream under
// ALWAYS, none under NEVER. A task recovered after a restart uploads every
// non-empty stream unless the policy is NEVER: its tail was rebuilt from
// disk and what was still in the pipe is lost, so the object is the
// authoritative record of what survived.
func (s *Server) planUploadsLocked(e *entry, recovered bool) {
	policy := e.rec.Upload
	for i := range 2 {
		ss := e.stream(i)
		if ss == nil || ss.Spill == nil {
			continue
		}
		var need bool
		switch policy {
		case agentv1.UploadPolicy_UPLOAD_POLICY_NEVER:
		case agentv1.UploadPolicy_UPLOAD_POLICY_ALWAYS:
			need = true
		default:
			if recovered {
				need = ss.Spill.Bytes > 0
			} else {
				need = ss.Truncated || ss.Sanitized || !ss.Spill.Complete
			}
		}
		if !need {
			ss.Spill.UploadState = agentv1.UploadState_UPLOAD_STATE_NOT_NEEDED
			continue
		}
		ss.Spill.UploadState = agentv1.UploadState_UPLOAD_STATE_PENDING
		ss.Spill.Url = s.bucketBase + "/" + ObjectKey(e.status.GetRef(), streamNames[i])
		e.uploads[i] = &uploadJob{next: time.Now()}
	}
	s.planOrderUploadLocked(e)
	s.updateBacklogLocked()
}

// planOrderUploadLocked uploads the order journal of a finished task whose
// streams both have bytes, or that has one, unless the policy is NEVER:
// the object "order"
// beside the streams' lets the output API serve both streams in one after
// the agent forgot the task, also when the status tails hold the streams
// (docs/output.md). A task that printed to one stream needs none. A
// journal never written (it writes nothing before its first switch, and
// stops at a write error) uploads as an empty object.
func (s *Server) planOrderUploadLocked(e *entry) {
	size := int64(0)
	if fi, err := os.Lstat(filepath.Join(s.store.outputDir(e.status.GetRef().GetUid()), outputorder.Name)); err == nil && fi.Mode().IsRegular() {
		size = fi.Size()
	}
	// A one-stream task has a journal only when a follower sealed the run
	// it read: its records frame the stream as that follower was served
	// it, and a read resumed from storage must frame it the same way.
	oneStream := e.status.GetStdout().GetTotalBytes() == 0 || e.status.GetStderr().GetTotalBytes() == 0
	if e.rec.Upload == agentv1.UploadPolicy_UPLOAD_POLICY_NEVER || (oneStream && size == 0) {
		return
	}
	e.status.Order = &agentv1.StreamStatus{TotalBytes: size, Spill: &agentv1.Spill{
		Bytes: size, Complete: true, UploadState: agentv1.UploadState_UPLOAD_STATE_PENDING,
		Url: s.bucketBase + "/" + ObjectKey(e.status.GetRef(), outputorder.Name),
	}}
	e.uploads[2] = &uploadJob{next: time.Now()}
}

func (s *Server) updateBacklogLocked() {
	n := 0
	for _, e := range s.tasks {
		n += e.pendingUploads()
	}
	s.metrics.UploadBacklog.Set(float64(n))
}

func (s *Server) kickUploader() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// backoff is the wait after the n-th consecutive failure (n >= 1):
// initial·2^(n-1), capped, with up to 10% jitter so agents that lost the
// same bucket do not retry in step.
func (s *Server) backoff(n int) time.Duration {
	d := s.cfg.UploadBackoffInitial
	for i := 1; i < n && d < s.cfg.UploadBackoffMax; i++ {
		d *= 2
	}
	d = min(d, s.cfg.UploadBackoffMax)
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}

// uploadLoop uploads pending streams one at a time, each when its backoff
// has passed, until ctx ends. One at a time keeps the agent's disk and
// network use bounded next to the tasks it runs.
func (s *Server) uploadLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Checked before every attempt, not only when idle: an attempt cut
		// short by the shutdown leaves its upload due at once, so the loop
		// would otherwise pick it again forever.
		if ctx.Err() != nil {
			return
		}
		e, i, wait := s.nextUpload()
		if e != nil {
			if key, ok := s.uploadOne(ctx, e, i); ok && s.mayHaveParts(e, i) {
				// The object holds every byte the parts did: they go, so
				// a finished stream costs its object alone
				// (docs/output.md). After the UPLOADED event, which
				// their deletion must not delay.
				dctx, cancel := context.WithTimeout(ctx, s.cfg.UploadTimeout)
				if n, err := s.deleteParts(dctx, outputkey.PartsPrefix(key)); err != nil {
					s.log.Warn("deleting the parts of an uploaded stream", "key", key, "deleted", n, "err", err)
				}
				cancel()
			}
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// mayHaveParts says whether upload i of e may have parts to delete: a
// stream always (an earlier incarnation may have uploaded them), the order
// journal when a stream of the task had parts, so a task whose output fit
// its tails costs no listing.
func (s *Server) mayHaveParts(e *entry, i int) bool {
	if i < 2 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.parts[2].kept > 0 || e.status.GetStdout().GetKeptBytes() > 0 || e.status.GetStderr().GetKeptBytes() > 0
}

// nextUpload returns the due upload that has waited longest (marked in
// flight), or how long to wait for the next one. It looks at every task
// without sorting them: it runs after each task's end.
func (s *Server) nextUpload() (*entry, int, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	wait := time.Hour
	var due *entry
	var dueStream int
	for _, e := range s.tasks {
		for i, j := range e.uploads {
			switch {
			case j == nil || j.inFlight:
			case j.next.After(now):
				wait = min(wait, j.next.Sub(now))
			case due == nil || j.next.Before(due.uploads[dueStream].next):
				due, dueStream = e, i
			}
		}
	}
	if due == nil {
		return nil, 0, wait
	}
	due.uploads[dueStream].inFlight = true
	return due, dueStream, 0
}

// uploadOne makes one attempt and records its outcome; it returns the key
// and true when the object is stored.
func (s *Server) uploadOne(ctx context.Context, e *entry, i int) (string, bool) {
	s.mu.Lock()
	uid := e.status.GetRef().GetUid()
	key := ObjectKey(e.status.GetRef(), uploadNames[i])
	streamStatus := statusOf(clone(e.status), i)
	s.mu.Unlock()
	file := filepath.Join(s.store.outputDir(uid), uploadNames[i])

	actx, cancel := context.WithTimeout(ctx, s.cfg.UploadTimeout)
	err := s.put(actx, file, key, streamStatus)
	cancel()

	s.mu.Lock()
	defer s.mu.Unlock()
	j := e.uploads[i]
	j.inFlight = false
	sp := e.stream(i).GetSpill()
	if err != nil {
		if ctx.Err() != nil {
			return key, false // shutting down: the next incarnation retries
		}
		sp.UploadAttempts++
		changed := sp.UploadError != err.Error()
		sp.UploadError = err.Error()
		j.next = time.Now().Add(s.backoff(int(sp.UploadAttempts)))
		s.metrics.Uploads.WithLabelValues("failure").Inc()
		s.log.Warn("upload failed; keeping the local file", "uid", uid, "key", key, "attempt", sp.UploadAttempts,
			"retryIn", time.Until(j.next).Round(time.Millisecond), "err", err)
		if werr := s.store.write(uid, e.rec, e.status); werr != nil {
			s.log.Error("recording upload failure", "uid", uid, "err", werr)
		}
		if changed {
			// The controller puts the error in the task's OutputUploaded
			// condition; a retry that fails the same way changes nothing
			// there and sends nothing.
			s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_UPLOAD_FAILED, e.status))
		}
		return key, false
	}
	e.uploads[i] = nil
	sp.UploadState = agentv1.UploadState_UPLOAD_STATE_UPLOADED
	sp.UploadError = ""
	s.metrics.Uploads.WithLabelValues("success").Inc()
	s.updateBacklogLocked()
	s.log.Info("uploaded", "uid", uid, "key", key, "bytes", sp.Bytes)
	if werr := s.store.write(uid, e.rec, e.status); werr != nil {
		s.log.Error("recording upload", "uid", uid, "err", werr)
	}
	s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_UPLOADED, e.status))
	if e.status.ForgetRequested && e.pendingUploads() == 0 {
		if err := s.forgetLocked(e); err != nil {
			s.log.Error("forgetting task after upload", "uid", uid, "err", err)
		}
	}
	return key, true
}

// put copies the file to key with its checksum and sizes as metadata. The
// file is read twice, first for the checksum, because metadata must be
// known before the first byte is written.
//
// The upload counts only when the writer's Close returned nil (many
// drivers report a failed write only there) and the stored object then has
// the spill file's size: a short object must never be reported complete.
// Each failure leaves the node's copy in place for the next attempt.
func (s *Server) put(ctx context.Context, file, key string, ss *agentv1.StreamStatus) error {
	var f io.ReadSeeker
	if ss.GetSpill().GetBytes() == 0 {
		// No byte reached a spill file, so the executor created none:
		// whatever is at that name is not the task's.
		f = bytes.NewReader(nil)
	} else {
		sf, err := os.Open(file)
		if err != nil {
			return fmt.Errorf("opening spill file: %w", err)
		}
		defer sf.Close()
		f = sf
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("reading spill file %s: %w", file, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want := ss.GetSpill().GetBytes(); n != want {
		return fmt.Errorf("spill file %s holds %d bytes, the stream's count is %d: not uploading a short or changed copy", file, n, want)
	}
	if want := ss.GetSha256(); ss.GetSpill().GetComplete() && want != "" && sum != want {
		return fmt.Errorf("spill file %s has SHA-256 %s, the stream's is %s: not uploading a changed copy", file, sum, want)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("reading spill file %s: %w", file, err)
	}
	opts := &blob.WriterOptions{
		ContentType: "application/octet-stream",
		Metadata: map[string]string{
			MetaSHA256:      sum,
			MetaBytes:       strconv.FormatInt(n, 10),
			MetaStreamBytes: strconv.FormatInt(ss.GetTotalBytes(), 10),
			MetaComplete:    strconv.FormatBool(ss.GetSpill().GetComplete()),
		},
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.bucket.NewWriter(wctx, key, opts)
	if err != nil {
		return fmt.Errorf("uploading %s: %w", key, err)
	}
	written, err := io.Copy(w, f)
	if err == nil && written != n {
		err = fmt.Errorf("wrote %d of the spill file's %d bytes", written, n)
	}
	if err != nil {
		cancel() // aborts the write: no partial object
		return errors.Join(fmt.Errorf("uploading %s: %w", key, err), w.Close())
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("uploading %s: closing the object writer: %w", key, err)
	}
	attrs, err := s.bucket.Attributes(ctx, key)
	switch {
	case gcerrors.Code(err) == gcerrors.PermissionDenied:
		// Credentials that may write but not read: Close's word is all
		// there is.
	case err != nil:
		return fmt.Errorf("checking %s after the upload: %w", key, err)
	case attrs.Size != n:
		return fmt.Errorf("object %s holds %d bytes after the upload, the spill file %d", key, attrs.Size, n)
	}
	return nil
}
