package outputapi

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/taskrecord"
)

// errDeleted is why a recorded task's agent is not asked for its output:
// the task was deleted, and what is kept of it is in the bucket.
var errDeleted = errors.New("the BashTask was deleted; its output is read from its record in the output bucket")

// lookupTask returns the task a request names: the live task when it
// exists and, with uid set, has that UID; else the record the controller
// kept in the output bucket when it let the task go (internal/taskrecord),
// the newest under the name when uid is empty. recorded says the task came
// from a record. A task neither live nor recorded is NotFound.
func (s *Server) lookupTask(ctx context.Context, ns, name string, uid types.UID) (task *bashtaskv1alpha1.BashTask, recorded bool, err error) {
	task, err = s.getTask(ctx, ns, name)
	if err == nil && (uid == "" || task.UID == uid) {
		return task, false, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, false, err
	}
	if s.bucket == nil {
		return nil, false, s.notFound(name, uid)
	}
	if uid == "" {
		task, err = taskrecord.Newest(ctx, s.bucket, ns, name)
	} else {
		task, err = taskrecord.Read(ctx, s.bucket, ns, name, uid)
	}
	switch {
	case errors.Is(err, taskrecord.ErrNotFound):
		return nil, false, s.notFound(name, uid)
	case err != nil:
		return nil, false, apierrors.NewServiceUnavailable(fmt.Sprintf("reading the record of task %s/%s: %v", ns, name, err))
	}
	return task, true, nil
}

// notFound is the NotFound of a task name, or of a UID under it.
func (s *Server) notFound(name string, uid types.UID) error {
	gr := bashtaskv1alpha1.GroupVersion.WithResource("bashtasks").GroupResource()
	if uid == "" {
		return apierrors.NewNotFound(gr, name)
	}
	return apierrors.NewNotFound(gr, fmt.Sprintf("%s (uid %s)", name, uid))
}

// recordedLog serves a deleted task's stream from what its record names:
// its uploaded copies, parts and status tails (see fromStorage). Its
// agent is not asked: a deleted task's agent has forgotten it.
func (s *Server) recordedLog(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o outputv1alpha1.LogOptions) error {
	if task.Status.NodeName == nil || *task.Status.NodeName == "" {
		if o.Stream == outputv1alpha1.StreamAll {
			return s.combinedFromStorage(ctx, lr, task, nil)
		}
		return s.fromStatus(lr, task, stream, o)
	}
	if o.Stream == outputv1alpha1.StreamAll {
		return s.combinedFromStorage(ctx, lr, task, errDeleted)
	}
	return s.fromStorage(ctx, lr, task, stream, o, errDeleted)
}
