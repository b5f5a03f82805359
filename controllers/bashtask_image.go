package controllers

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// imageStartDecision decides on a Start that the agent answered with a
// pull under way or a failed pull (agentpool.ImagePullingError,
// agentpool.ImageFailedError); ok is false for any other answer. A pull
// keeps the task dispatched and not started (its status.nodeName stays):
// the ImagePulled condition and status.image carry the progress, and the
// next pass, about a second later, finds the agent without the task and
// calls Start again (notStarted). A failed pull ends the task with the
// image reason.
func imageStartDecision(bt *bashtaskv1alpha1.BashTask, err error, now time.Time) (taskDecision, bool) {
	var pulling *agentpool.ImagePullingError
	var failed *agentpool.ImageFailedError
	switch {
	case errors.As(err, &pulling):
		requested := cmp.Or(pulling.Status.GetReference(), string(ptr.Deref(bt.Spec.Image, "")))
		bt.Status.Image = pullingImageStatus(requested, pulling.Status)
		setCondition(bt, bashtaskv1alpha1.ConditionImagePulled, false, bashtaskv1alpha1.ReasonImagePulling, pullProgress(pulling.Status))
		return taskDecision{write: "pull", result: reconcile.Result{RequeueAfter: imagePullRetry}}, true
	case errors.As(err, &failed):
		reason, msg := imageFailure(failed.Failure, failed.Node)
		setCondition(bt, bashtaskv1alpha1.ConditionImagePulled, false, string(reason), msg)
		setTerminal(bt, reason, msg, now)
		return taskDecision{write: "terminal", finished: true, events: []taskEvent{{corev1.EventTypeWarning, string(reason), "Pull", msg}}}, true
	}
	return taskDecision{}, false
}

// applyTaskImage copies the image an agent reports a task runs in into
// status.image (reference and digest, the progress cleared) and, for a
// task that names spec.image, sets ImagePulled=True. A report without an
// image (the node's root, or an agent that predates images) leaves
// status.image as it is: a workspace task's copy of its workspace's stays.
func applyTaskImage(bt *bashtaskv1alpha1.BashTask, ts *agentv1.TaskStatus) {
	img := ts.GetImage()
	if img == nil {
		return
	}
	bt.Status.Image = pulledImageStatus(img)
	if bt.Spec.Image != nil {
		setCondition(bt, bashtaskv1alpha1.ConditionImagePulled, true, bashtaskv1alpha1.ReasonImagePulled,
			fmt.Sprintf("image %s (%s) is on node %s", img.GetReference(), img.GetDigest(), nodeOf(&bt.Status)))
	}
}

// pullingMessage is the ImagePulled condition's message while the task's
// node pulls its image, "" otherwise.
func pullingMessage(st *bashtaskv1alpha1.BashTaskStatus) string {
	c := meta.FindStatusCondition(st.Conditions, bashtaskv1alpha1.ConditionImagePulled)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != bashtaskv1alpha1.ReasonImagePulling {
		return ""
	}
	return c.Message
}
