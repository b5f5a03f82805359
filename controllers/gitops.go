package controllers

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// GitOpsManager names the GitOps tool that manages obj and the key that
// says so, or returns "" when none does. A task such a tool manages must not
// be deleted by its TTL: the tool's next sync would find it missing and
// create it again, and the command would run again, every sync.
func GitOpsManager(obj client.Object) string {
	if _, ok := obj.GetAnnotations()[AnnotationArgoCDTrackingID]; ok {
		return "Argo CD (annotation " + AnnotationArgoCDTrackingID + ")"
	}
	if _, ok := obj.GetLabels()[LabelFluxKustomizationName]; ok {
		return "Flux (label " + LabelFluxKustomizationName + ")"
	}
	if _, ok := obj.GetLabels()[LabelAppInstance]; ok {
		return "Argo CD or Helm (label " + LabelAppInstance + ")"
	}
	return ""
}

// keptPastTTL records, once per task and controller process, that a task's
// TTL came due and the task was kept because a GitOps tool manages it.
// It reports whether this is the first time, when the event is due.
func (r *BashTaskReconciler) keptPastTTL(bt *bashtaskv1alpha1.BashTask) bool {
	key := client.ObjectKeyFromObject(bt)
	r.keptMu.Lock()
	defer r.keptMu.Unlock()
	if r.kept[key] == bt.UID {
		return false
	}
	r.kept[key] = bt.UID
	return true
}

// forgetKept drops the record of a task that no longer exists.
func (r *BashTaskReconciler) forgetKept(key types.NamespacedName) {
	r.keptMu.Lock()
	delete(r.kept, key)
	r.keptMu.Unlock()
}

// keepManaged decides whether a task whose TTL is due stays, and says why
// in one event per task and controller process.
func (r *BashTaskReconciler) keepManaged(bt *bashtaskv1alpha1.BashTask, ttl int32) bool {
	by := GitOpsManager(bt)
	if by == "" || r.opts.TTLDeletesGitOpsManaged {
		return false
	}
	if r.keptPastTTL(bt) {
		r.recorder.Eventf(bt, nil, corev1.EventTypeNormal, ReasonKeptPastTTL, "Delete",
			"Not deleted after its TTL of %ds: it is managed by %s, whose next sync would create it again and re-run the command. "+
				"Remove it through the tool (an Argo CD hook-delete-policy, removing it from the Flux Kustomization with prune on), or run the controller with --ttl-deletes-gitops-managed", ttl, by)
	}
	return true
}
