package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The port-forward part of the API (docs/portforward.md): the parent
// resource bashworkspaces and its subresource portforward, as RBAC names
// them (create on bashworkspaces/portforward in output.bashtask.dev, as
// kube-apiserver authorizes pods/portforward).
const (
	// ResourceWorkspaces is the parent resource, the view of a
	// bashtask.dev BashWorkspace.
	ResourceWorkspaces = "bashworkspaces"
	// SubresourcePortForward forwards TCP connections to ports on the
	// workspace's own loopback (POST with SPDY, GET with the WebSocket
	// tunneling of SPDY or the v4 WebSocket protocol, as
	// pods/portforward).
	SubresourcePortForward = "portforward"
	// ParamPorts is PortForwardOptions.Ports, one value per port.
	ParamPorts = "ports"
)

// BashWorkspace is the aggregated API's view of a bashtask.dev
// BashWorkspace: its identity and where it is. It exists so that
// bashworkspaces/portforward has a parent resource (discovery, routing,
// RBAC); the workspace itself is read and written through bashtask.dev.
//
// +kubebuilder:object:root=true
type BashWorkspace struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the workspace's identity, copied from the bashtask.dev
	// BashWorkspace: name, namespace, uid, resourceVersion, generation and
	// timestamps.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// status says where the workspace is.
	// +optional
	Status BashWorkspaceOutputStatus `json:"status"`
}

// BashWorkspaceOutputStatus is where a workspace is.
type BashWorkspaceOutputStatus struct {
	// nodeName is the node whose agent holds the workspace; empty while it
	// has none.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// phase is the workspace's status.phase.
	// +optional
	Phase string `json:"phase,omitempty"`
	// network is the workspace's network (None, Egress or Node): Node has
	// no network namespace of its own and is not forwarded to.
	// +optional
	Network string `json:"network,omitempty"`
}

// PortForwardOptions are the query parameters of bashworkspaces/portforward
// (docs/portforward.md), as PodPortForwardOptions of pods/portforward: the
// ports the v4 WebSocket protocol forwards. SPDY and its WebSocket
// tunneling name the port in each stream's headers instead.
//
// +kubebuilder:object:root=true
type PortForwardOptions struct {
	metav1.TypeMeta `json:",inline"`
	// ports are TCP ports on the workspace's loopback, each 1 to 65535.
	// +optional
	// +listType=atomic
	Ports []int32 `json:"ports,omitempty"`
}
