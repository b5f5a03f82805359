package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BashTask is the aggregated API's view of a bashtask.dev BashTask: its
// identity and how much of each stream is known. It exists so that
// bashtasks/log and bashtasks/stdin have a parent resource (discovery,
// `kubectl get --raw`); the task itself is read and written through
// bashtask.dev.
//
// +kubebuilder:object:root=true
type BashTask struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the task's identity, copied from the bashtask.dev
	// BashTask: name, namespace, uid, resourceVersion, generation and
	// timestamps.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// status is the output known to the task's status.
	// +optional
	Status BashTaskOutputStatus `json:"status"`
}

// BashTaskOutputStatus is how much output a task's status reports.
type BashTaskOutputStatus struct {
	// nodeName is the node whose agent runs or ran the task; empty while
	// the task waits for dispatch.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// stdoutBytes is the size of stdout in bytes as the task's status last
	// reported it (status.stdout.totalBytes, refreshed every progress
	// interval while the task runs).
	// +optional
	StdoutBytes int64 `json:"stdoutBytes"`
	// stderrBytes is the size of stderr in bytes as the task's status last
	// reported it (status.stderr.totalBytes).
	// +optional
	StderrBytes int64 `json:"stderrBytes"`
	// finished is true once the task has its terminal reason
	// (status.reason is set).
	// +optional
	Finished bool `json:"finished"`
}

// LogOptions are the query parameters of bashtasks/log (docs/output.md).
//
// +kubebuilder:object:root=true
type LogOptions struct {
	metav1.TypeMeta `json:",inline"`
	// stream is StreamStdout (the default), StreamStderr or StreamAll (both
	// in the order they were read, framed).
	// +optional
	Stream string `json:"stream,omitempty"`
	// offset is the first byte wanted, in bytes (not characters) from the
	// stream's start; default 0.
	// +optional
	Offset int64 `json:"offset,omitempty"`
	// limitBytes is the most bytes the body holds when positive: the body
	// ends after that many bytes.
	// +optional
	LimitBytes int64 `json:"limitBytes,omitempty"`
	// follow keeps the response open while the task runs and ends it once
	// the task has ended and every byte has been sent.
	// +optional
	Follow bool `json:"follow,omitempty"`
	// uid selects the task with this metadata.uid: the live task when it
	// has it, else the record of a deleted task of the name with it
	// (docs/output.md, "After the task is deleted"). Empty takes the live
	// task, else the newest record under the name.
	// +optional
	UID string `json:"uid,omitempty"`
}

// StdinOptions are the query parameters of bashtasks/stdin (docs/stdin.md).
//
// +kubebuilder:object:root=true
type StdinOptions struct {
	metav1.TypeMeta `json:",inline"`
	// offset is the input offset of the body's first byte, in bytes from
	// the start of the task's standard input; default 0.
	// +optional
	Offset int64 `json:"offset,omitempty"`
	// close closes the input after the body: the command reads EOF.
	// +optional
	Close bool `json:"close,omitempty"`
}
