package outputapi

import (
	"fmt"
	"net/url"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// Group and Version of the aggregated API (docs/output.md).
const (
	Group   = "output.bashtask.dev"
	Version = "v1alpha1"
)

// The response headers and trailers of bashtasks/log are the client
// package's (client.HeaderOffset and the rest): the contract has one
// spelling, in the package platforms import.

// SchemeGroupVersion is output.bashtask.dev/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// BashTask is the aggregated API's view of a bashtask.dev BashTask: its
// identity and how much of each stream is known. It exists so that
// bashtasks/log has a parent resource (discovery, `kubectl get --raw`);
// the task itself is read and written through bashtask.dev.
type BashTask struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Status is the output known to the task's status.
	Status BashTaskOutputStatus `json:"status"`
}

// BashTaskOutputStatus is how much output a task's status reports.
type BashTaskOutputStatus struct {
	// NodeName is the node whose agent runs or ran the task.
	NodeName string `json:"nodeName,omitempty"`
	// StdoutBytes and StderrBytes are the streams' sizes in bytes as the
	// status last reported them (refreshed every progress interval).
	StdoutBytes int64 `json:"stdoutBytes"`
	StderrBytes int64 `json:"stderrBytes"`
	// Finished is true once the task has its terminal reason.
	Finished bool `json:"finished"`
}

// DeepCopyObject implements runtime.Object.
func (b *BashTask) DeepCopyObject() runtime.Object {
	out := *b
	b.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// LogOptions are the query parameters of bashtasks/log.
type LogOptions struct {
	metav1.TypeMeta `json:",inline"`
	// Stream is "stdout" (the default) or "stderr".
	Stream string `json:"stream,omitempty"`
	// Offset is the first byte wanted, counted from the stream's start
	// (bytes, not characters); default 0.
	Offset int64 `json:"offset,omitempty"`
	// LimitBytes, when positive, ends the body after that many bytes.
	LimitBytes int64 `json:"limitBytes,omitempty"`
	// Follow keeps the response open while the task runs and ends it once
	// the task has ended and every byte has been sent.
	Follow bool `json:"follow,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (o *LogOptions) DeepCopyObject() runtime.Object {
	out := *o
	return &out
}

// StdinOptions are the query parameters of bashtasks/stdin.
type StdinOptions struct {
	metav1.TypeMeta `json:",inline"`
	// Offset is the input offset of the body's first byte (bytes from the
	// start of the task's standard input); default 0.
	Offset int64 `json:"offset,omitempty"`
	// Close closes the input after the body: the command reads EOF.
	Close bool `json:"close,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (o *StdinOptions) DeepCopyObject() runtime.Object {
	out := *o
	return &out
}

// decodeStdinOptions reads the query parameters; a bad value is an error
// naming the parameter.
func decodeStdinOptions(q url.Values, o *StdinOptions) error {
	var err error
	if v := q.Get("offset"); v != "" {
		if o.Offset, err = strconv.ParseInt(v, 10, 64); err != nil || o.Offset < 0 {
			return fmt.Errorf("offset %q: must be a byte count, 0 or more", v)
		}
	}
	if v := q.Get("close"); v != "" {
		if o.Close, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("close %q: must be true or false", v)
		}
	}
	return nil
}

// NewScheme returns the scheme of the aggregated API: BashTask, LogOptions
// and StdinOptions in output.bashtask.dev/v1alpha1 (also as the internal
// version, since this API has one version and no conversions), the meta
// types, and the decoding of the options from query parameters.
func NewScheme() (*runtime.Scheme, serializer.CodecFactory, error) {
	s := runtime.NewScheme()
	for _, gv := range []schema.GroupVersion{SchemeGroupVersion, {Group: Group, Version: runtime.APIVersionInternal}} {
		s.AddKnownTypes(gv, &BashTask{}, &LogOptions{}, &StdinOptions{})
	}
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	s.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	if err := s.AddConversionFunc((*url.Values)(nil), (*LogOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return decodeLogOptions(*(a.(*url.Values)), b.(*LogOptions))
	}); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	if err := s.AddConversionFunc((*url.Values)(nil), (*StdinOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return decodeStdinOptions(*(a.(*url.Values)), b.(*StdinOptions))
	}); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	if err := s.SetVersionPriority(SchemeGroupVersion); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	return s, serializer.NewCodecFactory(s), nil
}

// decodeLogOptions reads the query parameters; a bad value is an error
// naming the parameter.
func decodeLogOptions(q url.Values, o *LogOptions) error {
	o.Stream = q.Get("stream")
	switch o.Stream {
	case "":
		o.Stream = "stdout"
	case "stdout", "stderr":
	default:
		return fmt.Errorf("stream %q: must be stdout or stderr", o.Stream)
	}
	var err error
	if v := q.Get("offset"); v != "" {
		if o.Offset, err = strconv.ParseInt(v, 10, 64); err != nil || o.Offset < 0 {
			return fmt.Errorf("offset %q: must be a byte count, 0 or more", v)
		}
	}
	if v := q.Get("limitBytes"); v != "" {
		if o.LimitBytes, err = strconv.ParseInt(v, 10, 64); err != nil || o.LimitBytes < 1 {
			return fmt.Errorf("limitBytes %q: must be a byte count, 1 or more", v)
		}
	}
	if v := q.Get("follow"); v != "" {
		if o.Follow, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("follow %q: must be true or false", v)
		}
	}
	return nil
}
