package outputapi

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// getTask reads the BashTask from the controller's cache.
func (s *Server) getTask(ctx context.Context, ns, name string) (*bashtaskv1alpha1.BashTask, error) {
	var t bashtaskv1alpha1.BashTask
	err := s.cfg.Tasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
	if apierrors.IsNotFound(err) && s.cfg.LiveTasks != nil {
		// A task created a moment ago may not be in the cache yet.
		err = s.cfg.LiveTasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, apierrors.NewNotFound(bashtaskv1alpha1.GroupVersion.WithResource("bashtasks").GroupResource(), name)
		}
		return nil, apierrors.NewInternalError(err)
	}
	return &t, nil
}

func finished(t *bashtaskv1alpha1.BashTask) bool { return t.Status.Reason != nil }

func streamStatus(t *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream) *bashtaskv1alpha1.StreamStatus {
	if stream == agentv1.OutputStream_OUTPUT_STREAM_STDERR {
		return t.Status.Stderr
	}
	return t.Status.Stdout
}

// refetchLive is refetch from kube-apiserver when a live reader is set.
func (s *Server) refetchLive(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	if s.cfg.LiveTasks == nil {
		return s.refetch(ctx, task)
	}
	var t bashtaskv1alpha1.BashTask
	err := s.cfg.LiveTasks.Get(ctx, client.ObjectKey{Namespace: task.Namespace, Name: task.Name}, &t)
	if apierrors.IsNotFound(err) || (err == nil && t.UID != task.UID) {
		return nil, errTaskGone
	}
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return &t, nil
}

// refetch reads the task again: errTaskGone when it was deleted or
// re-created under its name.
func (s *Server) refetch(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	t, err := s.getTask(ctx, task.Namespace, task.Name)
	if apierrors.IsNotFound(err) || (err == nil && t.UID != task.UID) {
		return nil, errTaskGone
	}
	return t, err
}
