package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// imageGate checks a Pending workspace's image before it is placed or
// made: spec.image must parse (else Failed, InvalidSpec naming the
// field), and every Secret of spec.imagePullSecrets must exist (else the
// workspace waits, ImagePulled=False/MissingReference) and be of type
// kubernetes.io/dockerconfigjson (else Failed, InvalidSpec naming it).
// It returns the pull secrets' values, or done with the pass's result.
func (r *BashWorkspaceReconciler) imageGate(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) (secrets [][]byte, res reconcile.Result, done bool, err error) {
	if msg := imageReferenceError(ws.Spec.Image); msg != "" {
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceFailed, msg)
		p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonInvalidSpec, "Place", "%s", msg)
		return nil, reconcile.Result{}, true, reconcile.TerminalError(errors.New(msg))
	}
	secrets, err = pullSecrets(ctx, r.apiReader, ws.Namespace, ws.Spec.ImagePullSecrets)
	res, done, err = r.referenceOutcome(ws, p, bashtaskv1alpha1.ConditionImagePulled, err)
	if done {
		return nil, res, true, err
	}
	return secrets, res, false, nil
}

// imageAnswer decides on an EnsureWorkspace that the agent answered with
// a pull under way (the workspace stays Pending, with the progress in
// status.image and the ImagePulled condition, and is asked for again in
// about a second) or a failed pull (Failed with the image reason, a
// Warning event, and the workspace's waiting tasks end
// WorkspaceUnavailable naming it); done is false for a made workspace.
func (r *BashWorkspaceReconciler) imageAnswer(ws *bashtaskv1alpha1.BashWorkspace, node string, resp *agentv1.EnsureWorkspaceResponse, p *workspacePass) (reconcile.Result, bool, error) {
	if ip := resp.GetImagePull(); ip != nil {
		msg := pullProgress(ip)
		im := ptr.Deref(ws.Status.Image, bashtaskv1alpha1.ImageStatus{})
		if im.Requested == nil {
			im.Requested = optional(ip.GetReference())
		}
		im.DownloadedBytes, im.TotalBytes = ptr.To(ip.GetDownloadedBytes()), ptr.To(ip.GetTotalBytes())
		ws.Status.Image = &im
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, fmt.Sprintf("node %s is %s", node, msg))
		setWorkspaceImageCondition(ws, false, bashtaskv1alpha1.ReasonImagePulling, msg)
		return reconcile.Result{RequeueAfter: imagePullRetry}, true, nil
	}
	if f := resp.GetImageFailure(); f != nil {
		reason, msg := imageFailure(f, node)
		setWorkspaceFailed(ws, string(reason), msg)
		setWorkspaceImageCondition(ws, false, string(reason), msg)
		p.event(corev1.EventTypeWarning, string(reason), "Pull", "%s", msg)
		return reconcile.Result{}, true, reconcile.TerminalError(errors.New(msg))
	}
	return reconcile.Result{}, false, nil
}

// applyWorkspaceImage records the image a made workspace's tasks run in,
// as its agent reports it: the reference and the digest, the progress
// cleared, ImagePulled=True. A report without an image (the node's root)
// clears status.image, unless a digest was recorded: that stays, the
// image the workspace's files sit on.
func applyWorkspaceImage(ws *bashtaskv1alpha1.BashWorkspace, st *agentv1.WorkspaceStatus) {
	img := st.GetImage()
	if img == nil {
		if im := ws.Status.Image; im == nil || im.Digest == nil {
			ws.Status.Image = nil
			meta.RemoveStatusCondition(&ws.Status.Conditions, bashtaskv1alpha1.ConditionImagePulled)
		}
		return
	}
	ws.Status.Image = pulledImageStatus(img)
	setWorkspaceImageCondition(ws, true, bashtaskv1alpha1.ReasonImagePulled,
		fmt.Sprintf("image %s (%s) is on node %s", img.GetReference(), img.GetDigest(), ptr.Deref(ws.Status.NodeName, "")))
}

// setWorkspaceImageCondition sets the ImagePulled condition of ws.
func setWorkspaceImageCondition(ws *bashtaskv1alpha1.BashWorkspace, status bool, reason, message string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&ws.Status.Conditions, metav1.Condition{
		Type: bashtaskv1alpha1.ConditionImagePulled, Status: s, Reason: reason, Message: truncateMessage(message), ObservedGeneration: ws.Generation,
	})
}

// failedReason is the Ready and Stalled reason of a Failed workspace: the
// reason setWorkspaceFailed gave its Ready condition (an image failure,
// SnapshotRefused), else InvalidSpec.
func failedReason(st *bashtaskv1alpha1.BashWorkspaceStatus) string {
	if c := meta.FindStatusCondition(st.Conditions, bashtaskv1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		if _, image := imageFailureReasons[c.Reason]; image || c.Reason == bashtaskv1alpha1.WorkspaceReasonSnapshotRefused {
			return c.Reason
		}
	}
	return bashtaskv1alpha1.WorkspaceReasonInvalidSpec
}

// setWorkspaceFailed makes the workspace Failed with reason on its Ready
// and Stalled conditions (failedReason keeps it when the conditions are
// derived again).
func setWorkspaceFailed(ws *bashtaskv1alpha1.BashWorkspace, reason, message string) {
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceFailed, message)
	meta.SetStatusCondition(&ws.Status.Conditions, metav1.Condition{
		Type: bashtaskv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message: ptr.Deref(ws.Status.Message, ""), ObservedGeneration: ws.Generation,
	})
}
