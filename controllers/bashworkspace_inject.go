package controllers

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// egressInjections reads the Secret (and CA bundle) keys of
// spec.egress.inject (docs/egress.md). A missing Secret, ConfigMap or key
// is returned as missing, not as an error; err is a failed read or a
// value that breaks a rule the schema could not check (CR or LF in it,
// too long), as an *invalidValueError naming the field.
func (r *BashWorkspaceReconciler) egressInjections(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace) (out []*agentv1.EgressInjection, missing *missingReferenceError, err error) {
	if ws.Spec.Egress == nil {
		return nil, nil, nil
	}
	for i, in := range ws.Spec.Egress.Inject {
		field := fmt.Sprintf("spec.egress.inject[%d]", i)
		ref := in.SecretKeyRef
		raw, err := lookupKey(ctx, r.apiReader, ws.Namespace, field+".secretKeyRef", &bashtaskv1alpha1.ValueSource{SecretKeyRef: &ref})
		if err != nil {
			return nil, asMissing(err), ignoreMissing(err)
		}
		value := ptr.Deref(in.ValuePrefix, "") + strings.TrimRight(string(raw), "\r\n")
		switch {
		case strings.ContainsAny(value, "\r\n\x00"):
			return nil, nil, &invalidValueError{fmt.Sprintf("%s.secretKeyRef: the value of key %q of Secret %q holds a line break or NUL, which a header cannot", field, ref.Key, ref.Name)}
		case len(value) > bashtaskv1alpha1.MaxEgressHeaderValueBytes:
			return nil, nil, &invalidValueError{fmt.Sprintf("%s.secretKeyRef: the header value is %d bytes, over the limit of %d", field, len(value), bashtaskv1alpha1.MaxEgressHeaderValueBytes)}
		}
		rule := &agentv1.EgressInjection{Domain: in.Domain, Header: in.Header, Value: value, ScrubResponses: ptr.Deref(in.ScrubResponses, false)}
		if in.CABundle != nil {
			if rule.CaBundle, err = lookupKey(ctx, r.apiReader, ws.Namespace, field+".caBundle", in.CABundle); err != nil {
				return nil, asMissing(err), ignoreMissing(err)
			}
		}
		out = append(out, rule)
	}
	return out, nil, nil
}

// asMissing is err as a *missingReferenceError, or nil.
func asMissing(err error) *missingReferenceError {
	var missing *missingReferenceError
	if errors.As(err, &missing) {
		return missing
	}
	return nil
}

// ignoreMissing is err unless it is a *missingReferenceError.
func ignoreMissing(err error) error {
	var missing *missingReferenceError
	if errors.As(err, &missing) {
		return nil
	}
	return err
}

// egressGate resolves spec.egress.inject before the workspace is made: a
// missing Secret, ConfigMap or key keeps it Pending, with the condition
// EgressPolicy False (reason MissingReference) naming them, and it is
// looked at again every --retry-interval; an invalid value fails it.
func (r *BashWorkspaceReconciler) egressGate(ctx context.Context, ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass) ([]*agentv1.EgressInjection, reconcile.Result, bool, error) {
	inject, missing, err := r.egressInjections(ctx, ws)
	if missing != nil {
		err = missing
	}
	res, done, err := r.referenceOutcome(ws, p, bashtaskv1alpha1.ConditionEgressPolicy, err)
	return inject, res, done, err
}

// referenceOutcome is the outcome of resolving the objects a workspace
// refers to (Secrets, ConfigMaps) for a gate whose condition is condType:
// a missingReferenceError keeps the workspace Pending, condType False
// with reason MissingReference naming it, looked at again every
// --retry-interval; an invalidValueError fails it (InvalidSpec, with a
// Warning event, not retried); another error is returned for the
// workqueue's backoff. With err nil, done is false and a MissingReference
// condType is removed.
func (r *BashWorkspaceReconciler) referenceOutcome(ws *bashtaskv1alpha1.BashWorkspace, p *workspacePass, condType string, err error) (reconcile.Result, bool, error) {
	var missing *missingReferenceError
	var invalid *invalidValueError
	switch {
	case errors.As(err, &missing):
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspacePending, missing.Error())
		meta.SetStatusCondition(&ws.Status.Conditions, metav1.Condition{
			Type: condType, Status: metav1.ConditionFalse, ObservedGeneration: ws.Generation,
			Reason: ReasonMissingReference, Message: truncateMessage(missing.Error()),
		})
		return reconcile.Result{RequeueAfter: r.opts.RetryInterval}, true, nil
	case errors.As(err, &invalid):
		setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceFailed, invalid.Error())
		p.event(corev1.EventTypeWarning, bashtaskv1alpha1.WorkspaceReasonInvalidSpec, "Place", "%s", invalid.Error())
		return reconcile.Result{}, true, reconcile.TerminalError(err)
	case err != nil:
		return reconcile.Result{}, true, err
	}
	if c := meta.FindStatusCondition(ws.Status.Conditions, condType); c != nil && c.Reason == ReasonMissingReference {
		meta.RemoveStatusCondition(&ws.Status.Conditions, condType)
	}
	return reconcile.Result{}, false, nil
}

// setEgressMissing sets the condition EgressPolicy False, reason
// MissingReference, naming what spec.egress.inject waits for.
func setEgressMissing(ws *bashtaskv1alpha1.BashWorkspace, missing *missingReferenceError) {
	meta.SetStatusCondition(&ws.Status.Conditions, metav1.Condition{
		Type: bashtaskv1alpha1.ConditionEgressPolicy, Status: metav1.ConditionFalse, ObservedGeneration: ws.Generation,
		Reason: ReasonMissingReference, Message: missing.Error(),
	})
}

// withInjections puts the resolved injection rules into spec's policy.
func withInjections(spec *agentv1.WorkspaceSpec, inject []*agentv1.EgressInjection) {
	if spec.GetEgress() != nil {
		spec.Egress.Inject = inject
	}
}

// injectionDigest identifies the values sent to the agent without
// keeping them: a SHA-256 of the rules.
func injectionDigest(inject []*agentv1.EgressInjection) string {
	h := sha256.New()
	for _, in := range inject {
		fmt.Fprintf(h, "%q %q %q %q %t\n", in.GetDomain(), in.GetHeader(), in.GetValue(), in.GetCaBundle(), in.GetScrubResponses())
	}
	return string(h.Sum(nil))
}

// injectionsChanged says whether inject differs from what the agent of
// workspace uid last got from this controller (a rotated Secret): it is
// then sent again at the next status read. After a restart of the
// controller, once.
func (r *BashWorkspaceReconciler) injectionsChanged(uid types.UID, inject []*agentv1.EgressInjection) bool {
	last, ok := r.injected.Load(uid)
	return len(inject) > 0 && (!ok || last.(string) != injectionDigest(inject))
}
