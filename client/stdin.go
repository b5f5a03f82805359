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
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// StdinRequestBytes is the most bytes one bashtasks/stdin request carries,
// 4 MiB (the agent's limit per WriteStdin); a larger body is refused with
// 413. StdinWriter splits its writes to fit. The contract defines it:
// outputv1alpha1.StdinRequestBytes.
const StdinRequestBytes = outputv1alpha1.StdinRequestBytes

// Response headers of bashtasks/stdin (docs/stdin.md). The contract
// defines them, in api/output/v1alpha1; these names stay for the client's
// users.
const (
	// HeaderStdinOffset is A, the bytes of input accepted after the
	// request: the offset of the next byte to send
	// (outputv1alpha1.HeaderStdinOffset).
	HeaderStdinOffset = outputv1alpha1.HeaderStdinOffset
	// HeaderStdinClosed is "true" once the input accepts no more bytes
	// (outputv1alpha1.HeaderStdinClosed).
	HeaderStdinClosed = outputv1alpha1.HeaderStdinClosed
	// HeaderStdinReason says why it is closed: StdinReasonClosed,
	// StdinReasonIdleTimeout or StdinReasonProcessExited
	// (outputv1alpha1.HeaderStdinReason).
	HeaderStdinReason = outputv1alpha1.HeaderStdinReason
)

// Reasons of a closed input (HeaderStdinReason), defined by the contract
// in api/output/v1alpha1.
const (
	// StdinReasonClosed: a client closed it (close=true);
	// outputv1alpha1.StdinReasonClosed.
	StdinReasonClosed = outputv1alpha1.StdinReasonClosed
	// StdinReasonIdleTimeout: no request came for the task's
	// spec.stdinStream.idleTimeoutSeconds;
	// outputv1alpha1.StdinReasonIdleTimeout.
	StdinReasonIdleTimeout = outputv1alpha1.StdinReasonIdleTimeout
	// StdinReasonProcessExited: the command closed its standard input or
	// exited before the input was closed;
	// outputv1alpha1.StdinReasonProcessExited.
	StdinReasonProcessExited = outputv1alpha1.StdinReasonProcessExited
)

// StdinClosedError is a write refused because the task's input is closed:
// the bytes from Offset on were not accepted.
type StdinClosedError struct {
	// Offset is the bytes accepted; Reason why the input closed.
	Offset int64
	Reason string
}

func (e *StdinClosedError) Error() string {
	return fmt.Sprintf("the task's standard input is closed (%s) after %d bytes", e.Reason, e.Offset)
}

// StdinWriter writes a task's streamed standard input (spec.stdinStream)
// through output.bashtask.dev (RBAC: create on bashtasks/stdin in that
// group). Every byte is accepted once, in order, also across dropped
// connections: after a transport error or a 5xx it asks the server for the
// offset it accepted (an empty POST) and resends from there. It is an
// io.WriteCloser; Write and Close must not be called concurrently, Ping
// may be.
type StdinWriter struct {
	c        *Client
	ctx      context.Context
	ns, name string

	// MaxRetries bounds the failed requests in a row (transport errors,
	// 5xx) before a Write gives up; 0 means 30. Retries wait 100 ms,
	// doubling up to 2 s.
	MaxRetries int

	mu     sync.Mutex
	offset int64
	closed bool
	reason string
}

// Stdin returns a writer of the task's streamed input. Its first request,
// made here, asks for the offset accepted so far (Offset), so a caller
// resuming its input after a restart continues from there; it waits while
// the task is pending. The errors are those of the API (*apierrors.
// StatusError: 404, 403, 400 for a task without spec.stdinStream, 410 for
// one that has ended).
func (c *Client) Stdin(ctx context.Context, namespace, name string) (*StdinWriter, error) {
	w := &StdinWriter{c: c, ctx: ctx, ns: namespace, name: name}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(nil, false); err != nil {
		return nil, err
	}
	return w, nil
}

// Offset returns the bytes of input the server acknowledged.
func (w *StdinWriter) Offset() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.offset
}

// Write sends p at the writer's offset in requests of at most
// StdinRequestBytes, and returns once the server accepted all of it (the
// agent holds it in its bounded buffer or wrote it to the pipe): a command
// that does not read makes Write wait. A *StdinClosedError when the input
// closed first (n counts the bytes accepted before), an
// *apierrors.StatusError (410: the task has ended), or the context's error.
func (w *StdinWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := w.offset
	for len(p) > 0 {
		chunk := p[:min(len(p), StdinRequestBytes)]
		if err := w.send(chunk, false); err != nil {
			return int(w.offset - start), err
		}
		p = p[len(chunk):]
	}
	return int(w.offset - start), nil
}

// Close closes the input: the command reads EOF after the bytes sent. An
// input already closed (by another client, the idle timeout, the command's
// exit) or a task that has ended is no error: either way no more input
// reaches it.
func (w *StdinWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	err := w.send(nil, true)
	var ce *StdinClosedError
	if errors.As(err, &ce) || apierrors.IsGone(err) {
		return nil
	}
	return err
}

// Ping is an empty request: it tells the server the client is alive, which
// restarts the task's idle timeout (spec.stdinStream.idleTimeoutSeconds),
// and returns the offset accepted and whether the input is closed. An
// interactive client that may stay silent longer than the idle timeout
// pings at a fraction of it.
func (w *StdinWriter) Ping(ctx context.Context) (offset int64, closed bool, err error) {
	w.mu.Lock()
	off := w.offset
	w.mu.Unlock()
	a, cl, _, err := w.post(ctx, off, nil, false)
	return a, cl, err
}

// send delivers data at w.offset (with closeAfter, closes the input after
// it), retrying until every byte is acknowledged. Called with mu held.
func (w *StdinWriter) send(data []byte, closeAfter bool) error {
	maxRetries := w.MaxRetries
	if maxRetries <= 0 {
		maxRetries = 30
	}
	end := w.offset + int64(len(data))
	base := w.offset
	wait := 100 * time.Millisecond
	retries := 0
	lost := false // the last request failed: ask the offset before sending
	for {
		var a int64
		var closed bool
		var reason string
		var err error
		if lost {
			a, closed, reason, err = w.post(w.ctx, w.offset, nil, false)
		} else {
			a, closed, reason, err = w.post(w.ctx, w.offset, data[w.offset-base:], closeAfter)
		}
		if err == nil {
			if a < w.offset || a > end && len(data) > 0 {
				return fmt.Errorf("stdin: the server acknowledged offset %d, expected %d to %d: another client writes this input", a, w.offset, end)
			}
			w.offset, w.closed, w.reason = a, closed, reason
			if !lost {
				retries, wait = 0, 100*time.Millisecond
			}
			lost = false
			switch {
			case w.offset < end:
				if closed {
					return &StdinClosedError{Offset: w.offset, Reason: reason}
				}
				continue // part accepted (the wait for room ended): the rest
			case closeAfter && !closed:
				continue
			}
			return nil
		}
		var se *apierrors.StatusError
		if errors.As(err, &se) {
			code := se.ErrStatus.Code
			if code == http.StatusConflict && closed {
				w.offset, w.closed, w.reason = a, true, reason
				return &StdinClosedError{Offset: a, Reason: reason}
			}
			if code < 500 {
				return err
			}
		}
		if w.ctx.Err() != nil {
			return w.ctx.Err()
		}
		if retries++; retries > maxRetries {
			return fmt.Errorf("stdin at offset %d: giving up after %d attempts: %w", w.offset, retries, err)
		}
		lost = true
		select {
		case <-w.ctx.Done():
			return w.ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (w *StdinWriter) stdinURL(offset int64, closeAfter bool) string {
	u := *w.c.base
	u.Path = path.Join(u.Path, "/apis", outputv1alpha1.Group, outputv1alpha1.Version, "namespaces", w.ns, outputv1alpha1.Resource, w.name, outputv1alpha1.SubresourceStdin)
	q := url.Values{}
	q.Set(outputv1alpha1.ParamOffset, strconv.FormatInt(offset, 10))
	if closeAfter {
		q.Set(outputv1alpha1.ParamClose, "true")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// post makes one request and returns the headers' state; an answer other
// than 200 is an *apierrors.StatusError (with the state when the server
// sent it, as with 409).
func (w *StdinWriter) post(ctx context.Context, offset int64, data []byte, closeAfter bool) (accepted int64, closed bool, reason string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.stdinURL(offset, closeAfter), bytes.NewReader(data))
	if err != nil {
		return 0, false, "", err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	resp, err := w.c.http.Do(req)
	if err != nil {
		return 0, false, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	accepted, aerr := strconv.ParseInt(resp.Header.Get(HeaderStdinOffset), 10, 64)
	closed = resp.Header.Get(HeaderStdinClosed) == "true"
	reason = resp.Header.Get(HeaderStdinReason)
	if resp.StatusCode == http.StatusOK {
		if aerr != nil {
			return 0, false, "", fmt.Errorf("stdin: the response lacks %s", HeaderStdinOffset)
		}
		return accepted, closed, reason, nil
	}
	var st metav1.Status
	if json.Unmarshal(body, &st) != nil || st.Kind != "Status" {
		st = metav1.Status{Status: metav1.StatusFailure, Code: int32(resp.StatusCode), Message: fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))}
	}
	return accepted, closed, reason, &apierrors.StatusError{ErrStatus: st}
}
