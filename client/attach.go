package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"strconv"

	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// AttachOptions are the streams of Attach.
type AttachOptions struct {
	// Stdin is typed into the terminal as it is read: raw bytes, so 0x03
	// is ^C and reaches the foreground program as SIGINT. nil watches
	// the terminal only (no input, RBAC the same).
	Stdin io.Reader
	// Stdout receives what the terminal shows: the recent screen first
	// (the last 32 KiB of the task's stdout), then what follows.
	// Required.
	Stdout io.Writer
	// Sizes delivers the terminal's window sizes (a local terminal's,
	// kubectl's term.TTY.MonitorSize, or a UI's); nil keeps the task's
	// (24x80 until a client sets one).
	Sizes remotecommand.TerminalSizeQueue
}

// WindowSize is a terminal's size in character cells.
type WindowSize = remotecommand.TerminalSize

// ErrTaskEnded is Attach's error once the task it is attached to ended,
// wrapped with its exit code in an *AttachExitError when that is not 0.
var ErrTaskEnded = errors.New("the task ended")

// AttachExitError is Attach's error for a task that ended with a non-zero
// exit code.
type AttachExitError struct {
	// Code is the task's exit code (128+n for a signal n).
	Code int
	// Message is the server's, naming the reason (NonZeroExitCode,
	// Signaled, TimedOut, ...).
	Message string
}

func (e *AttachExitError) Error() string {
	return fmt.Sprintf("the task ended with exit code %d: %s", e.Code, e.Message)
}

// Attach attaches to the terminal of the BashTask ns/name (created with
// spec.tty, RunOptions.TTY) through bashtasks/attach of
// output.bashtask.dev, a WebSocket speaking v5.channel.k8s.io as `kubectl
// exec` does (RBAC: get and create on bashtasks/attach in that group). It
// returns nil once the task ended with exit code 0, an *AttachExitError
// with a non-zero one, ctx's error when ctx ended first (a detach: the
// task runs on and a later Attach carries on), and the server's refusal
// as an error wrapping an *apierrors.StatusError otherwise: 400 for a
// task without a terminal, 410 for one that has ended, 503 for one that
// did not start within 30 s, 429 past the agent's 8 sessions per task,
// 403 without create. A task still pending is waited for.
func (c *Client) Attach(ctx context.Context, ns, name string, o AttachOptions) error {
	if o.Stdout == nil {
		return errors.New("attach: AttachOptions.Stdout is required")
	}
	ex, err := remotecommand.NewWebSocketExecutor(c.cfg, "GET", c.attachURL(ns, name, o.Stdin != nil))
	if err != nil {
		return fmt.Errorf("attach to BashTask %s/%s: %w", ns, name, err)
	}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: o.Stdin, Stdout: o.Stdout, Tty: true, TerminalSizeQueue: o.Sizes})
	var exit exitStatuser
	var refused *httpstream.UpgradeFailureError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &exit):
		return &AttachExitError{Code: exit.ExitStatus(), Message: err.Error()}
	case errors.As(err, &refused):
		// The server's refusal, a Status (*apierrors.StatusError) the
		// upgrade error does not unwrap to.
		err = refused.Cause
	}
	return fmt.Errorf("attach to BashTask %s/%s: %w", ns, name, err)
}

// exitStatuser is the exit error of client-go's remotecommand executor
// (k8s.io/client-go/util/exec.CodeExitError).
type exitStatuser interface {
	error
	ExitStatus() int
}

func (c *Client) attachURL(ns, name string, stdin bool) string {
	u := *c.base
	u.Path = path.Join(u.Path, "/apis", outputv1alpha1.Group, outputv1alpha1.Version, "namespaces", ns, outputv1alpha1.Resource, name, outputv1alpha1.SubresourceAttach)
	u.RawQuery = url.Values{outputv1alpha1.ParamStdin: {strconv.FormatBool(stdin)}}.Encode()
	return u.String()
}
