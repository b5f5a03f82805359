package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// imagePullRetry is how soon an object whose node pulls its image is
// looked at again: its progress in status follows the pull about once a
// second.
const imagePullRetry = time.Second

// imageFailureReasons is the closed set of image failure reasons an agent
// may report (api/v1alpha1/image_types.go).
var imageFailureReasons = map[string]bashtaskv1alpha1.Reason{
	string(bashtaskv1alpha1.ReasonImageNotFound):     bashtaskv1alpha1.ReasonImageNotFound,
	string(bashtaskv1alpha1.ReasonImageUnauthorized): bashtaskv1alpha1.ReasonImageUnauthorized,
	string(bashtaskv1alpha1.ReasonImageUnsupported):  bashtaskv1alpha1.ReasonImageUnsupported,
	string(bashtaskv1alpha1.ReasonImageTooLarge):     bashtaskv1alpha1.ReasonImageTooLarge,
	string(bashtaskv1alpha1.ReasonImageShellMissing): bashtaskv1alpha1.ReasonImageShellMissing,
}

// imageReferenceError checks spec.image with go-containerregistry's
// parser (name.ParseReference, the distribution reference grammar) and
// returns why it does not parse, naming the field; "" for no image or
// one that parses.
func imageReferenceError(ref *bashtaskv1alpha1.ImageReference) string {
	if ref == nil {
		return ""
	}
	if _, err := name.ParseReference(string(*ref)); err != nil {
		return fmt.Sprintf("spec.image %q is not an image reference: %v", string(*ref), err)
	}
	return ""
}

// pullSecrets reads the Secrets of spec.imagePullSecrets in ns through
// reader (uncached: the controller may get Secrets, not list them) and
// returns their .dockerconfigjson values in the spec's order. A Secret
// that does not exist is a *missingReferenceError (the object waits for
// it); one of another type than kubernetes.io/dockerconfigjson, or
// without the key, an *invalidValueError.
func pullSecrets(ctx context.Context, reader client.Reader, ns string, refs []bashtaskv1alpha1.ImagePullSecret) ([][]byte, error) {
	out := make([][]byte, 0, len(refs))
	for i, ref := range refs {
		field := fmt.Sprintf("spec.imagePullSecrets[%d]", i)
		var s corev1.Secret
		if err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &s); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &missingReferenceError{field: field, kind: "Secret", name: ref.Name, objectMissing: true}
			}
			return nil, fmt.Errorf("%s: reading Secret %s/%s: %w", field, ns, ref.Name, err)
		}
		if s.Type != corev1.SecretTypeDockerConfigJson {
			return nil, &invalidValueError{fmt.Sprintf("%s: Secret %q is of type %q; an image pull secret must be of type %s", field, ref.Name, s.Type, corev1.SecretTypeDockerConfigJson)}
		}
		v, ok := s.Data[corev1.DockerConfigJsonKey]
		if !ok {
			return nil, &invalidValueError{fmt.Sprintf("%s: Secret %q has no key %s", field, ref.Name, corev1.DockerConfigJsonKey)}
		}
		out = append(out, v)
	}
	return out, nil
}

// taskImageSpec is the image of a task without a workspace's Start:
// spec.image with its pull secrets, nil without spec.image (the agent's
// default image, or the node's root).
func taskImageSpec(bt *bashtaskv1alpha1.BashTask, secrets [][]byte) *agentv1.ImageSpec {
	if bt.Spec.Image == nil {
		return nil
	}
	return &agentv1.ImageSpec{Reference: string(*bt.Spec.Image), PullSecrets: secrets}
}

// workspaceImageSpec is the image of ws's EnsureWorkspace. The digest is
// resolved once: a workspace whose status records one (its first make
// resolved it) asks for that digest under the recorded reference, on any
// node and however often it is made again. A workspace that was made
// without an image (made is true and status.image is absent) asks for
// the node's root, so that an agent's --default-image never changes what
// its files sit on. Otherwise spec.image, or nil without one.
//
// spec.rootInside goes with every one of them (root_inside): a
// workspace without spec.image then asks for the agent's default image
// with root inside, which an agent without one refuses.
func workspaceImageSpec(ws *bashtaskv1alpha1.BashWorkspace, made bool, secrets [][]byte) *agentv1.ImageSpec {
	spec := workspaceImageRef(ws, made, secrets)
	if ptr.Deref(ws.Spec.RootInside, false) {
		if spec == nil {
			spec = &agentv1.ImageSpec{}
		}
		spec.RootInside = true
	}
	return spec
}

// workspaceImageRef is workspaceImageSpec without spec.rootInside.
func workspaceImageRef(ws *bashtaskv1alpha1.BashWorkspace, made bool, secrets [][]byte) *agentv1.ImageSpec {
	if im := ws.Status.Image; im != nil && ptr.Deref(im.Digest, "") != "" {
		ref := ptr.Deref(im.Requested, "")
		if ref == "" && ws.Spec.Image != nil {
			ref = string(*ws.Spec.Image)
		}
		return &agentv1.ImageSpec{Reference: ref, Digest: *im.Digest, PullSecrets: secrets}
	}
	if made && ws.Status.Image == nil {
		return &agentv1.ImageSpec{NodeRoot: true}
	}
	if ws.Spec.Image == nil {
		return nil
	}
	return &agentv1.ImageSpec{Reference: string(*ws.Spec.Image), PullSecrets: secrets}
}

// pullProgress is the ImagePulled condition's message while a node pulls:
// "pulled 12.3 MiB of 45.6 MiB" (compressed layer bytes, binary MiB with
// one decimal), with the image and the last error of a pull the agent
// retries.
func pullProgress(st *agentv1.ImageStatus) string {
	msg := "resolving the image's manifest"
	if total := st.GetTotalBytes(); total > 0 {
		msg = fmt.Sprintf("pulled %s of %s", mib(st.GetDownloadedBytes()), mib(total))
	}
	if ref := st.GetReference(); ref != "" {
		msg = fmt.Sprintf("pulling image %s: %s", ref, msg)
	}
	if m := st.GetMessage(); m != "" {
		msg += "; retrying after: " + m
	}
	return msg
}

// mib formats n bytes in MiB with one decimal.
func mib(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// pullingImageStatus is status.image while a node pulls requested.
func pullingImageStatus(requested string, st *agentv1.ImageStatus) *bashtaskv1alpha1.ImageStatus {
	return &bashtaskv1alpha1.ImageStatus{
		Requested:       optional(requested),
		DownloadedBytes: ptr.To(st.GetDownloadedBytes()),
		TotalBytes:      ptr.To(st.GetTotalBytes()),
	}
}

// pulledImageStatus is status.image once the node has the image: the
// reference and the digest it resolved to, the progress cleared; nil for
// the node's root (st nil).
func pulledImageStatus(st *agentv1.ImageStatus) *bashtaskv1alpha1.ImageStatus {
	if st == nil {
		return nil
	}
	return &bashtaskv1alpha1.ImageStatus{Requested: optional(st.GetReference()), Digest: optional(st.GetDigest())}
}

// imageFailure maps an agent's image failure to the object's reason and
// message; a reason outside the API's set becomes StartFailed, naming it.
func imageFailure(f *agentv1.ImageFailure, node string) (bashtaskv1alpha1.Reason, string) {
	reason, known := imageFailureReasons[f.GetReason()]
	msg := fmt.Sprintf("the image cannot be pulled on node %s: %s", node, f.GetMessage())
	if !known {
		return bashtaskv1alpha1.ReasonStartFailed, fmt.Sprintf("%s (the agent reported the unknown reason %q)", msg, f.GetReason())
	}
	return reason, fmt.Sprintf("%s: %s", reason, msg)
}
