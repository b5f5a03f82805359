package outputapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Intervals of a followed response.
const (
	// taskCheckInterval is how often a follow looks at the task in the
	// controller's cache (an in-memory read) to notice its deletion or its
	// replacement by a task of the same name.
	taskCheckInterval = time.Second
	// agentRetryInterval is the longest wait before a follow or a write of
	// input asks an agent again after its stream broke (an agent
	// restarting comes back within seconds; the task ends AgentLost if it
	// does not).
	agentRetryInterval = 500 * time.Millisecond
	// agentFirstRetry is the first such wait, doubled at each retry up to
	// agentRetryInterval. The usual cause is a request that reached the
	// agent a moment before the controller's Start did (the node is
	// written first, and the Running status only after the controller's
	// RunningStatusDelay): the agent knows the task a few milliseconds
	// later. The task's next change in the informer ends a wait at once.
	agentFirstRetry = 10 * time.Millisecond
)

// errTaskGone is the cause of a follow ended because its task was deleted
// or re-created under the same name.
var errTaskGone = errors.New("the BashTask was deleted")

// watchTask cancels a follow with errTaskGone once the task is deleted or
// replaced by one of the same name.
func (s *Server) watchTask(ctx context.Context, cancel context.CancelCauseFunc, ns, name string, uid types.UID) {
	tick := time.NewTicker(taskCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var t bashtaskv1alpha1.BashTask
		err := s.cfg.Tasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
		// A task being deleted is stopped by the controller, so its stream
		// ends on its own, with every byte: only its disappearance ends
		// the follow here.
		if apierrors.IsNotFound(err) || (err == nil && t.UID != uid) {
			cancel(errTaskGone)
			return
		}
	}
}

// streamLog writes the response: from the agent while it holds the task
// (live, or its spill file after the end), else from the uploaded object,
// else from the status's tail when that is the whole stream. It returns an
// API status error before the headers are written and a plain error after.
func (s *Server) streamLog(ctx context.Context, lr *logResponse, task *bashtaskv1alpha1.BashTask, stream agentv1.OutputStream, o outputv1alpha1.LogOptions) error {
	retry := agentFirstRetry
	for {
		if task.Status.NodeName == nil || *task.Status.NodeName == "" {
			if finished(task) {
				// Never dispatched (refused, cancelled while pending):
				// the streams are empty.
				if o.Stream == outputv1alpha1.StreamAll {
					return s.combinedFromStorage(ctx, lr, task, nil)
				}
				return s.fromStatus(lr, task, stream, o)
			}
			if !o.Follow {
				if !lr.started {
					lr.start(task.UID, o.Offset, 0, false)
				}
				return nil
			}
			// Not dispatched yet: wait for the node.
			t, err := s.waitDispatched(ctx, task)
			if err != nil {
				return err
			}
			task = t
			continue
		}
		node := *task.Status.NodeName
		ended, err := s.fromAgent(ctx, lr, task, node, stream, o, "")
		if err == nil || ended {
			return err
		}
		var se *apierrors.StatusError
		if errors.As(err, &se) {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		// The agent does not hold the task (forgotten) or cannot be
		// reached: a finished task's output is in object storage or in
		// its status; a running one waits for its agent.
		// From kube-apiserver, not the cache: the agent forgets a task
		// once the controller recorded its end and uploads, which the
		// cache may not show yet.
		fresh, gerr := s.refetchLive(ctx, task)
		if gerr != nil {
			return gerr
		}
		task = fresh
		if finished(task) && !errors.Is(err, errAgentBroke) {
			if o.Stream == outputv1alpha1.StreamAll {
				return s.combinedFromStorage(ctx, lr, task, err)
			}
			return s.fromStorage(ctx, lr, task, stream, o, err)
		}
		if !o.Follow && !lr.started && status.Code(err) == codes.NotFound {
			// Dispatched (the node is written first) but not started on
			// the agent yet: nothing written so far.
			lr.start(task.UID, lr.offset, 0, false)
			return nil
		}
		if !o.Follow && !lr.started && !finished(task) {
			return apierrors.NewServiceUnavailable(fmt.Sprintf("%s of task %s/%s: %v", o.Stream, task.Namespace, task.Name, err))
		}
		if err := s.waitRetry(ctx, task, retry); err != nil {
			return err
		}
		retry = min(2*retry, agentRetryInterval)
		if fresh, gerr = s.refetch(ctx, task); gerr != nil {
			return gerr
		}
		task = fresh
	}
}
