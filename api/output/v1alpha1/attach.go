package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SubresourceAttach attaches to a task's terminal (spec.tty; docs/output.md,
// "A terminal"): a WebSocket GET speaking the remote command protocol
// v5.channel.k8s.io, as `kubectl exec` and `kubectl attach` do. RBAC names
// both get and create on bashtasks/attach, as Kubernetes asks of
// pods/attach over WebSocket: neither the log's get nor stdin's create
// grants it.
const SubresourceAttach = "attach"

// ParamStdin is AttachOptions.Stdin, true or false.
const ParamStdin = "stdin"

// Channels of an attach session (the remote command protocol's): the
// terminal's input (client to server), its output (server to client), the
// session's end as a Status (server to client, once) and window sizes as
// JSON {"Width":cols,"Height":rows} (client to server). Channel 2,
// stderr, carries nothing: a terminal has one output.
const (
	ChannelStdin  = 0
	ChannelStdout = 1
	ChannelError  = 3
	ChannelResize = 4
)

// AttachOptions are the query parameters of bashtasks/attach.
//
// +kubebuilder:object:root=true
type AttachOptions struct {
	metav1.TypeMeta `json:",inline"`
	// stdin sends the client's input (channel 0) to the terminal; false
	// watches the terminal only, its output and its end.
	// +optional
	Stdin bool `json:"stdin,omitempty"`
}
