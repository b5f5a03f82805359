package plugin

import (
	"context"
	"errors"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// stdinReadBytes is the most one read of the local stdin takes: a terminal
// returns a line per read whatever the size, a pipe up to this much, and
// each read is sent as it is (StdinWriter splits at 4 MiB).
const stdinReadBytes = 256 << 10

// pumpStdin sends the local stdin to the task's streamed stdin until local
// EOF, which closes it, or until the task's stdin or the task ends. It
// pings at a third of the idle timeout so a silent terminal does not close
// the task's stdin while the plugin runs. Problems are notes: the task's
// own end is what run reports.
func (a *app) pumpStdin(ctx context.Context, oc *btclient.Client, bt *bashtaskv1alpha1.BashTask) {
	w, err := oc.Stdin(ctx, bt.Namespace, bt.Name)
	if err != nil {
		// A task that ended before its input was needed is no problem.
		if ctx.Err() == nil && !apierrors.IsGone(err) {
			a.note("--stream: the task's stdin: %v", err)
		}
		return
	}
	idle := time.Duration(bashtaskv1alpha1.DefaultStdinIdleTimeoutSeconds) * time.Second
	if s := bt.Spec.StdinStream; s != nil && s.IdleTimeoutSeconds != nil {
		idle = time.Duration(*s.IdleTimeoutSeconds) * time.Second
	}
	pctx, stopPing := context.WithCancel(ctx)
	defer stopPing()
	go func() {
		t := time.NewTicker(max(idle/3, 300*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
				if _, closed, err := w.Ping(pctx); closed || (err != nil && pctx.Err() == nil && !isRetryable(err)) {
					return
				}
			}
		}
	}()
	buf := make([]byte, stdinReadBytes)
	for {
		n, rerr := a.opts.IOStreams.In.Read(buf)
		if ctx.Err() != nil {
			return
		}
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				var ce *btclient.StdinClosedError
				switch {
				case ctx.Err() != nil:
				case errors.As(err, &ce) && ce.Reason == btclient.StdinReasonIdleTimeout:
					a.note("--stream: the task's stdin was closed after %d bytes: no input within its idle timeout (--stdin-idle-timeout)", ce.Offset)
				case errors.As(err, &ce), apierrors.IsGone(err):
					// The command closed its stdin or exited: nothing to say.
				default:
					a.note("--stream: sending stdin: %v", err)
				}
				return
			}
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				a.note("--stream: reading the local stdin: %v", rerr)
			}
			if err := w.Close(); err != nil && ctx.Err() == nil {
				a.note("--stream: closing the task's stdin: %v", err)
			}
			return
		}
	}
}

// isRetryable is true for a ping's failure that a later ping may not have
// (the connection, a 5xx); an API refusal stops pinging.
func isRetryable(err error) bool {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Code >= 500
	}
	return true
}
