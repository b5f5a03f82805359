package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// deletedDrain bounds how long the streams of a task deleted while it is
// followed may take to end after the deletion was seen: the output API
// ends them when the stream ends (the controller stops a deleted task) or
// within a second of the task's disappearance.
const deletedDrain = 10 * time.Second

// copyBufferBytes is the size of one read from the output API. A read
// returns as soon as some bytes arrived, so this bounds memory, not
// latency.
const copyBufferBytes = 32 << 10

// streamTarget is one stream of a task and the local writer its bytes go
// to.
type streamTarget struct {
	name string // "stdout" or "stderr"
	out  io.Writer
}

// streamResult is how the reading of one stream ended: its bytes
// [0, written) went to the local writer, hash has their SHA-256, and err
// is nil when the stream was read to its end. An err that is a
// *btclient.StreamError says the output API cannot serve the bytes from
// written on; any other err is a failure to read or write.
type streamResult struct {
	written int64
	hash    hash.Hash
	err     error
}

// writeError is a failure to write to the local writer.
type writeError struct {
	stream string
	err    error
}

func (e *writeError) Error() string { return fmt.Sprintf("writing %s: %v", e.stream, e.err) }

func (e *writeError) Unwrap() error { return e.err }

// copyStream copies one stream of a task from its first byte to t.out
// through output.bashtask.dev, each chunk as it arrives; with follow,
// until the task has ended and every byte was read, else up to the bytes
// known when the request started. A 410 (bytes not kept) becomes a
// *btclient.StreamError at the offset reached, as the same cause found in
// the middle of a response is.
func copyStream(ctx context.Context, oc *btclient.Client, key types.NamespacedName, t streamTarget, follow bool) streamResult {
	return copyStreamFrom(ctx, oc, key, t, follow, streamResult{hash: sha256.New()})
}

// copyStreamFrom is copyStream from res.written on, adding to res: the
// rest of a stream that a combined copy could not read whole.
func copyStreamFrom(ctx context.Context, oc *btclient.Client, key types.NamespacedName, t streamTarget, follow bool, res streamResult) streamResult {
	res.err = nil
	r, err := oc.FollowLog(ctx, key.Namespace, key.Name, btclient.LogOptions{Stream: t.name, Offset: res.written, Follow: follow})
	if err != nil {
		res.err = asStreamError(err, res.written)
		return res
	}
	defer func() { _ = r.Close() }()
	buf := make([]byte, copyBufferBytes)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := t.out.Write(buf[:n]); werr != nil {
				res.err = &writeError{stream: t.name, err: werr}
				return res
			}
			res.hash.Write(buf[:n])
			res.written += int64(n)
		}
		if errors.Is(err, io.EOF) {
			return res
		}
		if err != nil {
			res.err = asStreamError(err, res.written)
			return res
		}
	}
}

// combinedResult is how the reading of both streams in one ended: each
// stream's bytes and hash as streamResult has them, and err as
// streamResult's, for the framed stream.
type combinedResult struct {
	streams [2]streamResult
	err     error
}

// hashingWriter counts and hashes what it passes to out.
type hashingWriter struct {
	name string
	out  io.Writer
	res  *streamResult
}

func (w hashingWriter) Write(p []byte) (int, error) {
	n, err := w.out.Write(p)
	w.res.hash.Write(p[:n])
	w.res.written += int64(n)
	if err != nil {
		return n, &writeError{stream: w.name, err: err}
	}
	return n, nil
}

// copyCombined copies both streams of a task in the order they were read
// (stream=all) to stdout and stderr, each frame's payload as it arrives;
// follow as in copyStream.
func copyCombined(ctx context.Context, oc *btclient.Client, key types.NamespacedName, stdout, stderr io.Writer, follow bool) combinedResult {
	res := combinedResult{streams: [2]streamResult{{hash: sha256.New()}, {hash: sha256.New()}}}
	r, err := oc.FollowLog(ctx, key.Namespace, key.Name, btclient.LogOptions{Stream: outputv1alpha1.StreamAll, Follow: follow})
	if err != nil {
		res.err = asStreamError(err, 0)
		return res
	}
	defer func() { _ = r.Close() }()
	_, err = btclient.Demux(r, hashingWriter{"stdout", stdout, &res.streams[0]}, hashingWriter{"stderr", stderr, &res.streams[1]})
	if err != nil {
		res.err = asStreamError(err, r.Offset())
	}
	return res
}

// copyBoth copies run's two targets, stdout and stderr, through one
// combined follow, so that the local writes keep the order in which the
// agent read the command's output; where the combined stream cannot be
// served whole (bytes not kept), each stream goes on alone from the
// offset it reached, as copyStream would.
func copyBoth(ctx context.Context, oc *btclient.Client, key types.NamespacedName, targets []streamTarget) [2]streamResult {
	res := copyCombined(ctx, oc, key, targets[0].out, targets[1].out, true)
	if res.err == nil || !errors.As(res.err, new(*btclient.StreamError)) {
		res.streams[0].err, res.streams[1].err = res.err, res.err
		return res.streams
	}
	for i, t := range targets {
		res.streams[i] = copyStreamFrom(ctx, oc, key, t, true, res.streams[i])
	}
	return res.streams
}

// combinedTargets reports whether targets are run's stdout and stderr,
// which followTask reads through one combined follow.
func combinedTargets(targets []streamTarget) bool {
	return len(targets) == 2 && targets[0].name == outputv1alpha1.StreamStdout && targets[1].name == outputv1alpha1.StreamStderr
}

// asStreamError turns a 410 Gone, the output API's answer for bytes it
// does not keep, into a *btclient.StreamError at offset.
func asStreamError(err error, offset int64) error {
	var se *apierrors.StatusError
	if errors.As(err, &se) && se.ErrStatus.Code == http.StatusGone {
		return &btclient.StreamError{Offset: offset, Message: se.ErrStatus.Message}
	}
	return err
}

// outputError says which stream could not be read and, for the causes a
// user can fix, how. A task re-created under its name while it was
// followed counts as deleted.
func outputError(stream string, key types.NamespacedName, err error) error {
	if errors.As(err, new(*writeError)) {
		return err
	}
	if errors.Is(err, btclient.ErrTaskReplaced) {
		return fmt.Errorf("reading %s of task %s: %w: %w", stream, key, errTaskDeleted, err)
	}
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		switch code := se.ErrStatus.Code; {
		case code == http.StatusForbidden:
			err = fmt.Errorf("%w (reading output takes get on bashtasks/log in the API group output.bashtask.dev)", err)
		case code == http.StatusNotFound && (se.ErrStatus.Details == nil || se.ErrStatus.Details.Name == ""):
			// The output API's own 404 names the task; kube-apiserver's
			// for a group nobody serves names nothing.
			err = fmt.Errorf("%w (the cluster does not serve output.bashtask.dev/v1alpha1: install the controller's output API, docs/install.md)", err)
		}
	}
	return fmt.Errorf("reading %s of task %s through output.bashtask.dev: %w", stream, key, err)
}

// followOutput copies the targets' streams of a task as they are written,
// all at once, and watches the task until it has ended and every stream
// was read to its end or to bytes the output API cannot serve. It returns
// the task's last state seen (terminal) and each stream's result.
//
// An interrupt calls onInterrupt (interrupts may be nil); its error ends
// the following. A task deleted while it is followed ends it with a
// *deletedError once its streams ended, or deletedDrain after. A stream
// that cannot be read for another reason than bytes not kept (RBAC, an
// unreachable API, a local write) ends it with that error.
func (a *app) followOutput(ctx context.Context, c client.WithWatch, oc *btclient.Client, key types.NamespacedName,
	interrupts <-chan os.Signal, onInterrupt interruptFunc, targets ...streamTarget) (*bashtaskv1alpha1.BashTask, []streamResult, error) {
	return a.followTask(ctx, c, oc, key, followHooks{}, interrupts, onInterrupt, targets...)
}

// followHooks are what run adds to followOutput.
type followHooks struct {
	// created is the task as its create returned it: the watch starts at
	// its resourceVersion, without a read first.
	created *bashtaskv1alpha1.BashTask
	// observe, when set, sees every state of the task the watch
	// delivers (run's notes).
	observe func(*bashtaskv1alpha1.BashTask)
}

// followTask is followOutput with hooks. Once the task has ended, a
// stream whose status tail is the whole stream is not read further: its
// copy is stopped and the tail gives what it had not written.
func (a *app) followTask(ctx context.Context, c client.WithWatch, oc *btclient.Client, key types.NamespacedName, hooks followHooks,
	interrupts <-chan os.Signal, onInterrupt interruptFunc, targets ...streamTarget) (*bashtaskv1alpha1.BashTask, []streamResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Every return waits for the goroutines: a copy must not write to its
	// target after its caller moved on.
	defer func() { cancel(); wg.Wait() }()

	var last atomic.Pointer[bashtaskv1alpha1.BashTask]
	watched := make(chan error, 1)
	wg.Go(func() {
		watched <- watchTaskFrom(ctx, c, key, hooks.created, nil, nil, func(bt *bashtaskv1alpha1.BashTask) (bool, error) {
			last.Store(bt)
			if hooks.observe != nil {
				hooks.observe(bt)
			}
			return isFinished(bt), nil
		})
	})
	type indexed struct {
		i   int
		res streamResult
	}
	copied := make(chan indexed, len(targets))
	stops := make([]context.CancelFunc, len(targets))
	combined := combinedTargets(targets)
	if combined {
		cctx, stop := context.WithCancel(ctx)
		stops[0], stops[1] = stop, stop
		wg.Go(func() {
			r := copyBoth(cctx, oc, key, targets)
			copied <- indexed{0, r[0]}
			copied <- indexed{1, r[1]}
		})
	}
	for i, t := range targets {
		if combined {
			break
		}
		cctx, stop := context.WithCancel(ctx)
		stops[i] = stop
		wg.Go(func() { copied <- indexed{i, copyStream(cctx, oc, key, t, true)} })
	}

	results := make([]streamResult, len(targets))
	copying := make([]bool, len(targets))
	for i := range copying {
		copying[i] = true
	}
	cut := make([]bool, len(targets))
	copies, watching := len(targets), true
	var deleted error
	var drain <-chan time.Time
	for copies > 0 || watching {
		select {
		case <-interrupts:
			if err := onInterrupt(ctx); err != nil {
				return nil, nil, err
			}
		case r := <-copied:
			copies--
			copying[r.i] = false
			if cut[r.i] {
				r.res = fromWholeTail(targets[r.i], r.res, last.Load())
			}
			results[r.i] = r.res
			if err := r.res.err; err != nil && !errors.As(err, new(*btclient.StreamError)) {
				if deleted != nil {
					return nil, nil, deleted
				}
				return nil, nil, outputError(targets[r.i].name, key, err)
			}
		case err := <-watched:
			watching = false
			if errors.Is(err, errTaskDeleted) {
				deleted = err
				drain = time.After(deletedDrain)
			} else if err != nil {
				return nil, nil, err
			}
			cutWholeTails(last.Load(), targets, combined, copying, cut, stops)
		case <-drain:
			return nil, nil, deleted
		}
	}
	if deleted != nil {
		return nil, nil, deleted
	}
	return last.Load(), results, nil
}

// cutWholeTails stops the copies, still running when the task has ended
// (final), of the streams its status tail holds whole: the tail has their
// bytes, and reading them again through the output API would only add its
// round trips to the command's end (docs/kubectl-plugin.md). A combined
// copy is stopped only when both tails are whole and one stream is
// empty: where both have bytes, only the combined stream has their order.
func cutWholeTails(final *bashtaskv1alpha1.BashTask, targets []streamTarget, combined bool, copying, cut []bool, stops []context.CancelFunc) {
	if final == nil || !isFinished(final) {
		return
	}
	if combined {
		out, errOut := streamOf(final, targets[0].name), streamOf(final, targets[1].name)
		empty := func(s *bashtaskv1alpha1.StreamStatus) bool { return s == nil || ptr.Deref(s.TotalBytes, 0) == 0 }
		if copying[0] && copying[1] && tailIsWhole(out) && tailIsWhole(errOut) && (empty(out) || empty(errOut)) {
			cut[0], cut[1] = true, true
			stops[0]()
		}
		return
	}
	for i, t := range targets {
		if copying[i] && tailIsWhole(streamOf(final, t.name)) {
			cut[i] = true
			stops[i]()
		}
	}
}

// tailIsWhole reports whether a stream's status tail is the whole stream,
// byte for byte: not shortened, no byte replaced. A stream without a
// status is empty.
func tailIsWhole(s *bashtaskv1alpha1.StreamStatus) bool {
	if s == nil {
		return true
	}
	return !ptr.Deref(s.Truncated, false) && !ptr.Deref(s.Sanitized, false) &&
		int64(len(ptr.Deref(s.Tail, ""))) == ptr.Deref(s.TotalBytes, 0)
}

// fromWholeTail completes a copy stopped by cutWholeTails from the tail:
// the bytes it had not written yet. A failure to write locally stays the
// copy's result.
func fromWholeTail(t streamTarget, res streamResult, final *bashtaskv1alpha1.BashTask) streamResult {
	if errors.As(res.err, new(*writeError)) {
		return res
	}
	tail := []byte(ptr.Deref(ptr.Deref(streamOf(final, t.name), bashtaskv1alpha1.StreamStatus{}).Tail, ""))
	res.err = nil
	if res.written > int64(len(tail)) {
		return res // verify names the difference
	}
	rest := tail[res.written:]
	if _, err := t.out.Write(rest); err != nil {
		res.err = &writeError{stream: t.name, err: err}
		return res
	}
	res.hash.Write(rest)
	res.written += int64(len(rest))
	return res
}

// finishStream completes and checks one stream of a task that has ended,
// read by copyStream into res. Where the output API stopped at bytes it
// does not keep (past spec.output.spillLimitBytes, say) and the status
// tail holds the exact rest, the rest comes from the tail; with tailOK, a
// hole before the tail is accepted after a note, and the tail follows.
// Otherwise the output stops at the first byte that cannot be had, and the
// error says which bytes and why. A stream that is the whole of it is
// checked against status sha256.
func (a *app) finishStream(t streamTarget, res *streamResult, final *bashtaskv1alpha1.BashTask, tailOK bool) error {
	s := streamOf(final, t.name)
	var se *btclient.StreamError
	if res.err != nil && !errors.As(res.err, &se) {
		return outputError(t.name, types.NamespacedName{Namespace: final.Namespace, Name: final.Name}, res.err)
	}
	if se == nil {
		return verify(t.name, res, s)
	}
	if s == nil {
		return &incompleteError{stream: t.name, offset: res.written, end: -1, total: -1, why: se.Message}
	}
	tail, total, sanitized := ptr.Deref(s.Tail, ""), ptr.Deref(s.TotalBytes, 0), ptr.Deref(s.Sanitized, false)
	start := total - int64(len(tail))
	// A sanitized tail has U+FFFD where the stream had other bytes: its
	// offsets are not the stream's.
	exactRest := !sanitized && start <= res.written && res.written < total
	// Where the bytes that can be had start again.
	end := total
	if !sanitized {
		end = max(start, res.written)
	}
	if !exactRest && !tailOK {
		return &incompleteError{stream: t.name, offset: res.written, end: end, total: total, tail: len(tail), sanitized: sanitized, why: se.Message}
	}
	from := int64(0)
	if exactRest {
		from = res.written - start
	} else {
		what := fmt.Sprintf("the last %d bytes kept in status follow", len(tail))
		if sanitized {
			// The whole tail: its offsets say nothing of the stream's.
			what += ", with U+FFFD in place of invalid UTF-8"
		} else if res.written > start {
			from = res.written - start
		}
		a.note("%s: bytes %d to %d of %d cannot be read (%s); %s", t.name, res.written, end, total, se.Message, what)
	}
	rest := []byte(tail[from:])
	if _, err := t.out.Write(rest); err != nil {
		return &writeError{stream: t.name, err: err}
	}
	res.hash.Write(rest)
	res.written += int64(len(rest))
	if !exactRest {
		return nil // not the stream's bytes: nothing to check
	}
	return verify(t.name, res, s)
}

// verify checks the bytes of a stream read to its end against its final
// status: as many as status totalBytes, with its sha256. Fewer would be a
// short output behind a clean end.
func verify(name string, res *streamResult, s *bashtaskv1alpha1.StreamStatus) error {
	if s == nil {
		return nil
	}
	total := ptr.Deref(s.TotalBytes, 0)
	if res.written < total {
		return fmt.Errorf("%s: the output API ended the stream after %d bytes, but status.%s.totalBytes is %d", name, res.written, name, total)
	}
	want := ptr.Deref(s.SHA256, "")
	if want == "" || res.written != total {
		return nil
	}
	if got := hex.EncodeToString(res.hash.Sum(nil)); got != want {
		return fmt.Errorf("%s: the %d bytes written have SHA-256 %s, but status.%s.sha256 is %s", name, res.written, got, name, want)
	}
	return nil
}

// incompleteError says that a stream's output stopped at bytes the output
// API cannot serve and the status tail does not hold.
type incompleteError struct {
	stream string
	// offset is where the bytes written end; end is where the bytes that
	// can be had start again (the tail's start, or total), total the
	// stream's size; -1 when unknown (the task still runs).
	offset, end, total int64
	tail               int
	sanitized          bool
	// why is the output API's reason, naming the offset.
	why string
}

func (e *incompleteError) Error() string {
	wrote := fmt.Sprintf("wrote the first %d bytes", e.offset)
	if e.offset == 0 {
		wrote = "wrote none of it"
	}
	if e.total < 0 {
		return fmt.Sprintf("%s: bytes from %d on cannot be read: %s; %s", e.stream, e.offset, e.why, wrote)
	}
	accept := fmt.Sprintf("the last %d bytes kept in status after a note", e.tail)
	if e.sanitized {
		accept += ", with U+FFFD in place of invalid UTF-8"
	}
	return fmt.Sprintf("%s: bytes %d to %d of %d cannot be read: %s; %s rather than a stream with a hole (add --tail-ok to accept %s)",
		e.stream, e.offset, e.end, e.total, e.why, wrote, accept)
}
