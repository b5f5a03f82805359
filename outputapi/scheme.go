package outputapi

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// NewScheme returns the scheme of the aggregated API: BashTask, LogOptions,
// StdinOptions, BashWorkspace and PortForwardOptions in output.bashtask.dev/v1alpha1 (also as the internal
// version, since this API has one version and no conversions), the meta
// types, and the decoding of the options from query parameters.
func NewScheme() (*runtime.Scheme, serializer.CodecFactory, error) {
	s := runtime.NewScheme()
	gv := outputv1alpha1.SchemeGroupVersion
	for _, gv := range []schema.GroupVersion{gv, {Group: outputv1alpha1.Group, Version: runtime.APIVersionInternal}} {
		s.AddKnownTypes(gv, &outputv1alpha1.BashTask{}, &outputv1alpha1.LogOptions{}, &outputv1alpha1.StdinOptions{}, &outputv1alpha1.AttachOptions{},
			&outputv1alpha1.BashWorkspace{}, &outputv1alpha1.PortForwardOptions{})
	}
	metav1.AddToGroupVersion(s, gv)
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	s.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	if err := s.AddConversionFunc((*url.Values)(nil), (*outputv1alpha1.LogOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return decodeLogOptions(*(a.(*url.Values)), b.(*outputv1alpha1.LogOptions))
	}); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	if err := s.AddConversionFunc((*url.Values)(nil), (*outputv1alpha1.StdinOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return decodeStdinOptions(*(a.(*url.Values)), b.(*outputv1alpha1.StdinOptions))
	}); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	if err := s.AddConversionFunc((*url.Values)(nil), (*outputv1alpha1.PortForwardOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return decodePortForwardOptions(*(a.(*url.Values)), b.(*outputv1alpha1.PortForwardOptions))
	}); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	if err := s.AddConversionFunc((*url.Values)(nil), (*outputv1alpha1.AttachOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return decodeAttachOptions(*(a.(*url.Values)), b.(*outputv1alpha1.AttachOptions))
	}); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	if err := s.SetVersionPriority(gv); err != nil {
		return nil, serializer.CodecFactory{}, err
	}
	return s, serializer.NewCodecFactory(s), nil
}

// decodeLogOptions reads the query parameters; a bad value is an error
// naming the parameter.
func decodeLogOptions(q url.Values, o *outputv1alpha1.LogOptions) error {
	o.Stream = q.Get(outputv1alpha1.ParamStream)
	switch o.Stream {
	case "":
		o.Stream = outputv1alpha1.StreamStdout
	case outputv1alpha1.StreamStdout, outputv1alpha1.StreamStderr, outputv1alpha1.StreamAll:
	default:
		return fmt.Errorf("stream %q: must be stdout, stderr or all", o.Stream)
	}
	var err error
	if v := q.Get(outputv1alpha1.ParamOffset); v != "" {
		if o.Offset, err = strconv.ParseInt(v, 10, 64); err != nil || o.Offset < 0 {
			return fmt.Errorf("offset %q: must be a byte count, 0 or more", v)
		}
	}
	if v := q.Get(outputv1alpha1.ParamLimitBytes); v != "" {
		if o.LimitBytes, err = strconv.ParseInt(v, 10, 64); err != nil || o.LimitBytes < 1 {
			return fmt.Errorf("limitBytes %q: must be a byte count, 1 or more", v)
		}
	}
	if v := q.Get(outputv1alpha1.ParamFollow); v != "" {
		if o.Follow, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("follow %q: must be true or false", v)
		}
	}
	o.UID = q.Get(outputv1alpha1.ParamUID)
	if len(o.UID) > maxUIDBytes || strings.ContainsAny(o.UID, "/") {
		return fmt.Errorf("uid %q: must be a metadata.uid, at most %d bytes without '/'", o.UID, maxUIDBytes)
	}
	return nil
}

// maxUIDBytes bounds the uid parameter, in bytes: a metadata.uid is a
// 36-byte UUID; the bound leaves room for other UID forms and keeps the
// parameter out of other keys in the bucket.
const maxUIDBytes = 128

// decodeStdinOptions reads the query parameters; a bad value is an error
// naming the parameter.
func decodeStdinOptions(q url.Values, o *outputv1alpha1.StdinOptions) error {
	var err error
	if v := q.Get(outputv1alpha1.ParamOffset); v != "" {
		if o.Offset, err = strconv.ParseInt(v, 10, 64); err != nil || o.Offset < 0 {
			return fmt.Errorf("offset %q: must be a byte count, 0 or more", v)
		}
	}
	if v := q.Get(outputv1alpha1.ParamClose); v != "" {
		if o.Close, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("close %q: must be true or false", v)
		}
	}
	return nil
}
