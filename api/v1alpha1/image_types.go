package v1alpha1

// ImageReference is an OCI image reference as a pod's spec.containers[].image
// takes it: [registry/]repository[:tag][@sha256:digest], 1 to 512
// characters, no white space. A reference without a registry means
// Docker Hub, without a tag or digest the tag latest (the distribution
// reference grammar). The controller parses it before anything is pulled
// and ends the object InvalidSpec naming the field when it does not parse.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=512
// +kubebuilder:validation:Pattern=`^[^\s]+$`
type ImageReference string

// ImagePullSecret names a Secret of type kubernetes.io/dockerconfigjson
// in the object's namespace, as a pod's spec.imagePullSecrets entry does.
type ImagePullSecret struct {
	// name of the Secret, a DNS subdomain.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`
}

// ImageStatus is the image an object's tasks run in, as the node resolved
// and pulled it (docs/images.md).
type ImageStatus struct {
	// requested is the image reference asked for: spec.image, or the
	// agent's default image (--default-image) when the spec names none.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Requested *string `json:"requested,omitempty"`

	// digest is the manifest digest the reference resolved to
	// (sha256:<64 hex>), resolved once, when the workspace was first made:
	// a restore on another node pulls this digest, never a newer tag.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	Digest *string `json:"digest,omitempty"`

	// downloadedBytes is the pull's progress in bytes of compressed
	// layers while the node pulls the image; absent once it is on the
	// node.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DownloadedBytes *int64 `json:"downloadedBytes,omitempty"`

	// totalBytes is the size in bytes of the image's compressed layers,
	// while the node pulls it; absent once it is on the node.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TotalBytes *int64 `json:"totalBytes,omitempty"`
}

// Image failure reasons: of a BashTask without a workspace (status.reason)
// and of a BashWorkspace (its Ready condition and its ImagePulled
// condition), each with the registry's message. A network failure is
// retried with backoff and ends none of them.
const (
	// ReasonImageNotFound: the registry has no such repository, tag or
	// digest.
	ReasonImageNotFound Reason = "ImageNotFound"
	// ReasonImageUnauthorized: the registry refused the credentials (or
	// their absence): spec.imagePullSecrets.
	ReasonImageUnauthorized Reason = "ImageUnauthorized"
	// ReasonImageUnsupported: the image has no manifest for the node's
	// platform (linux and its architecture), or a media type the node
	// cannot unpack.
	ReasonImageUnsupported Reason = "ImageUnsupported"
	// ReasonImageTooLarge: the unpacked image is larger than the node's
	// whole image cache budget (the agent's --image-cache-size).
	ReasonImageTooLarge Reason = "ImageTooLarge"
	// ReasonImageShellMissing: the image has no bash (/bin/bash or
	// /usr/bin/bash); a task's command runs as `bash -c` and never falls
	// back to another shell.
	ReasonImageShellMissing Reason = "ImageShellMissing"
)

// ConditionImagePulled is the condition of a BashWorkspace (and of a
// BashTask without a workspace) that names an image: False with the reason
// Pulling and the progress in its message while the node pulls, True once
// the image is on the node, False with an image failure reason otherwise.
const ConditionImagePulled = "ImagePulled"

// ReasonImagePulling is the ImagePulled condition's reason while the node
// pulls the image; ReasonImagePulled once it has it.
const (
	ReasonImagePulling = "Pulling"
	ReasonImagePulled  = "Pulled"
)
