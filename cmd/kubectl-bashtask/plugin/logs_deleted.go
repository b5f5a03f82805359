package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// deletedTask reports whether logs reads a deleted task's record: the task
// key names does not exist, or uid is set and the live task has another.
func deletedTask(ctx context.Context, c client.Client, key types.NamespacedName, uid string) (bool, error) {
	bt := &bashtaskv1alpha1.BashTask{}
	err := c.Get(ctx, key, bt)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading task %s: %w", key, err)
	}
	return uid != "" && string(bt.UID) != uid, nil
}

// logsDeleted prints one stream of a deleted task from its record
// (docs/output.md, "After the task is deleted"): the newest of the name,
// or the one with uid. Bytes the output API cannot serve end it with an
// incompleteError, as for a live task.
func (a *app) logsDeleted(ctx context.Context, oc *btclient.Client, key types.NamespacedName, uid types.UID, t streamTarget) error {
	r, err := oc.FollowLog(ctx, key.Namespace, key.Name, btclient.LogOptions{Stream: t.name, UID: uid})
	if err != nil {
		return recordError(t.name, key, uid, err)
	}
	defer func() { _ = r.Close() }()
	n, err := copyAll(t.out, r, t.name)
	if werr := new(writeError); errors.As(err, &werr) {
		return werr
	}
	var se *btclient.StreamError
	if errors.As(err, &se) {
		return &incompleteError{stream: t.name, offset: n, end: -1, total: -1, why: se.Message}
	}
	if err != nil {
		return recordError(t.name, key, uid, err)
	}
	return nil
}

// logsDeletedAll is logsDeleted of both streams in the order they were
// read (--stream all).
func (a *app) logsDeletedAll(ctx context.Context, oc *btclient.Client, key types.NamespacedName, uid types.UID) error {
	r, err := oc.FollowLog(ctx, key.Namespace, key.Name, btclient.LogOptions{Stream: outputv1alpha1.StreamAll, UID: uid})
	if err != nil {
		return recordError("stdout and stderr", key, uid, err)
	}
	defer func() { _ = r.Close() }()
	_, err = btclient.Demux(r, a.opts.IOStreams.Out, a.opts.IOStreams.ErrOut)
	var se *btclient.StreamError
	if errors.As(err, &se) {
		return &incompleteError{stream: "stdout and stderr", offset: se.Offset, end: -1, total: -1, why: se.Message}
	}
	if err != nil {
		return recordError("stdout and stderr", key, uid, err)
	}
	return nil
}

// copyAll copies r to out; a failed local write is a *writeError.
func copyAll(out io.Writer, r *btclient.LogReader, stream string) (int64, error) {
	buf := make([]byte, copyBufferBytes)
	var n int64
	for {
		m, err := r.Read(buf)
		if m > 0 {
			if _, werr := out.Write(buf[:m]); werr != nil {
				return n, &writeError{stream: stream, err: werr}
			}
			n += int64(m)
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// recordError is outputError for a deleted task, saying which one.
func recordError(stream string, key types.NamespacedName, uid types.UID, err error) error {
	if apierrors.IsNotFound(err) {
		what := "no record of it is kept in the output bucket"
		if uid != "" {
			what = fmt.Sprintf("no task with uid %s exists or is recorded in the output bucket", uid)
		}
		return fmt.Errorf("task %s is not found: %s (docs/output.md, \"After the task is deleted\"): %w", key, what, err)
	}
	return outputError(stream, key, err)
}
