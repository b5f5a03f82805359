package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// Response headers and trailers of bashtasks/log (docs/output.md). The
// contract defines them, in api/output/v1alpha1; these names stay for the
// client's users.
const (
	// HeaderOffset is the offset of the body's first byte in the stream:
	// outputv1alpha1.HeaderOffset.
	HeaderOffset = outputv1alpha1.HeaderOffset
	// HeaderTotal is how many bytes of the stream were known when the
	// response started: outputv1alpha1.HeaderTotal.
	HeaderTotal = outputv1alpha1.HeaderTotal
	// HeaderComplete is "true" when the task had ended when the response
	// started, so HeaderTotal is final: outputv1alpha1.HeaderComplete.
	HeaderComplete = outputv1alpha1.HeaderComplete
	// HeaderTaskUID is the task's metadata.uid:
	// outputv1alpha1.HeaderTaskUID.
	HeaderTaskUID = outputv1alpha1.HeaderTaskUID
	// TrailerEndOffset is the offset after the body's last byte, sent when
	// a response ends early because bytes cannot be served:
	// outputv1alpha1.TrailerEndOffset.
	TrailerEndOffset = outputv1alpha1.TrailerEndOffset
	// TrailerError says why, naming the offset:
	// outputv1alpha1.TrailerError.
	TrailerError = outputv1alpha1.TrailerError
)

// LogOptions select what FollowLog reads.
type LogOptions struct {
	// Stream is "stdout" (empty means stdout), "stderr", or "all": both in
	// the order they were read, framed (Demux splits them; Offset counts
	// framed bytes).
	Stream string
	// Offset is the first byte wanted (bytes from the stream's start).
	Offset int64
	// Follow keeps reading while the task runs, until it has ended and
	// every byte was read.
	Follow bool
	// UID, when set, reads the task with this metadata.uid: the live task
	// when it has it, else the record of a deleted one (docs/output.md,
	// "After the task is deleted"). Empty reads the live task, else the
	// newest deleted one of the name.
	UID types.UID
	// MaxRetries bounds the reconnects in a row that bring no byte and
	// no answer (transport errors, 503); 0 means 30. Reconnects wait 100
	// ms, doubling up to 2 s.
	MaxRetries int
}

// StreamError is a stream's end before its last byte: the bytes from
// Offset cannot be served (past spillLimitBytes, an upload lost, the task
// deleted while followed). Every byte before Offset was delivered.
type StreamError struct {
	// Offset is where the delivered bytes end.
	Offset int64
	// Message is the server's reason, naming the offset.
	Message string
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("output from offset %d cannot be served: %s", e.Offset, e.Message)
}

// ErrTaskReplaced is returned by a LogReader whose task was deleted and
// created again under the same name between two of its requests: the new
// task's bytes are another stream.
var ErrTaskReplaced = errors.New("the BashTask was re-created under the same name (its UID changed)")

// LogReader reads one stream of a task through output.bashtask.dev,
// reconnecting at its next offset after a transport error: every byte is
// delivered once, in order, none skipped or repeated.
type LogReader struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelFunc
	ns     string
	name   string
	opts   LogOptions

	resp     *http.Response
	offset   int64
	uid      types.UID
	total    int64
	complete bool
	err      error
	retries  int
	// respBytes counts the current response's bytes.
	respBytes int64
}

// FollowLog opens the stream. The first request is made here, so a
// missing task or a refused offset is its error (an *apierrors.StatusError:
// 404, 403, 410 past what is kept, 416 past the end). Close the reader.
func (c *Client) FollowLog(ctx context.Context, ns, name string, opts LogOptions) (*LogReader, error) {
	if opts.Stream == "" {
		opts.Stream = outputv1alpha1.StreamStdout
	}
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = 30
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &LogReader{c: c, ctx: ctx, cancel: cancel, ns: ns, name: name, opts: opts, offset: opts.Offset}
	if err := r.connect(); err != nil {
		cancel()
		return nil, err
	}
	return r, nil
}

// Offset is the offset of the next byte Read returns.
func (r *LogReader) Offset() int64 { return r.offset }

// UID is the task's UID, from the first response.
func (r *LogReader) UID() types.UID { return r.uid }

// Close ends the reader and its request.
func (r *LogReader) Close() error {
	r.cancel()
	if r.resp != nil {
		_ = r.resp.Body.Close()
		r.resp = nil
	}
	return nil
}

func (r *LogReader) logURL() string {
	u := *r.c.base
	u.Path = path.Join(u.Path, "/apis", outputv1alpha1.Group, outputv1alpha1.Version, "namespaces", r.ns, outputv1alpha1.Resource, r.name, outputv1alpha1.SubresourceLog)
	q := url.Values{}
	q.Set(outputv1alpha1.ParamStream, r.opts.Stream)
	q.Set(outputv1alpha1.ParamOffset, strconv.FormatInt(r.offset, 10))
	q.Set(outputv1alpha1.ParamFollow, strconv.FormatBool(r.opts.Follow))
	if r.opts.UID != "" {
		q.Set(outputv1alpha1.ParamUID, string(r.opts.UID))
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// connect makes one request at r.offset. A transport error or 503 is
// retried here with backoff; an API error is returned.
func (r *LogReader) connect() error {
	wait := 100 * time.Millisecond
	for {
		err := r.request()
		if err == nil {
			return nil
		}
		var se *apierrors.StatusError
		if errors.As(err, &se) && se.ErrStatus.Code != http.StatusServiceUnavailable || errors.Is(err, ErrTaskReplaced) || r.ctx.Err() != nil {
			return err
		}
		r.retries++
		if r.retries > r.opts.MaxRetries {
			return fmt.Errorf("output from offset %d: giving up after %d attempts: %w", r.offset, r.retries, err)
		}
		select {
		case <-r.ctx.Done():
			return r.ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (r *LogReader) request() error {
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, r.logURL(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/octet-stream, application/json")
	resp, err := r.c.http.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var st metav1.Status
		if json.Unmarshal(body, &st) != nil || st.Kind != "Status" {
			st = metav1.Status{Status: metav1.StatusFailure, Code: int32(resp.StatusCode), Message: fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))}
		}
		return &apierrors.StatusError{ErrStatus: st}
	}
	uid := types.UID(resp.Header.Get(HeaderTaskUID))
	if r.uid != "" && uid != r.uid {
		_ = resp.Body.Close()
		return ErrTaskReplaced
	}
	if got := resp.Header.Get(HeaderOffset); got != strconv.FormatInt(r.offset, 10) {
		_ = resp.Body.Close()
		return fmt.Errorf("the response starts at offset %q, asked for %d", got, r.offset)
	}
	r.uid = uid
	r.total, _ = strconv.ParseInt(resp.Header.Get(HeaderTotal), 10, 64)
	r.complete = resp.Header.Get(HeaderComplete) == "true"
	r.resp = resp
	r.respBytes = 0
	return nil
}

// Read implements io.Reader. It returns io.EOF once the stream is read to
// its end (with Follow: the task has ended), a *StreamError when the
// server cannot serve the next bytes, ErrTaskReplaced, or the API error of
// a reconnect.
func (r *LogReader) Read(p []byte) (int, error) {
	for {
		if r.err != nil {
			return 0, r.err
		}
		if r.resp == nil {
			if err := r.connect(); err != nil {
				r.err = err
				return 0, err
			}
		}
		n, err := r.resp.Body.Read(p)
		r.offset += int64(n)
		r.respBytes += int64(n)
		if n > 0 {
			r.retries = 0
		}
		if err == nil {
			return n, nil
		}
		resp := r.resp
		_ = resp.Body.Close()
		r.resp = nil
		if errors.Is(err, io.EOF) {
			if msg := resp.Trailer.Get(TrailerError); msg != "" {
				r.err = &StreamError{Offset: r.offset, Message: msg}
			} else if !r.opts.Follow || (r.complete && r.offset >= r.total) {
				r.err = io.EOF
			}
			// Otherwise the response ended without saying the stream did:
			// ask again at the offset, which answers whether it has. An
			// empty one counts as a failed attempt, so this cannot spin.
			if r.err == nil && r.respBytes == 0 {
				if r.retries++; r.retries > r.opts.MaxRetries {
					r.err = fmt.Errorf("output from offset %d: %d responses in a row ended without a byte or the stream's end", r.offset, r.retries)
				}
			}
		} else if r.ctx.Err() != nil {
			r.err = r.ctx.Err()
		}
		// A transport error (the connection cut): reconnect at r.offset.
		if n > 0 {
			return n, nil
		}
	}
}
