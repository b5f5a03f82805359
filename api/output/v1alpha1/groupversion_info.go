package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of the aggregated API, as its APIService
// (v1alpha1.output.bashtask.dev) registers it with kube-apiserver.
const (
	Group   = "output.bashtask.dev"
	Version = "v1alpha1"
)

var (
	// SchemeGroupVersion is output.bashtask.dev/v1alpha1, the group and
	// version of every type in this package.
	SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

	// SchemeBuilder collects the functions that register this package's
	// types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds BashTask, LogOptions, StdinOptions, AttachOptions,
	// BashWorkspace and PortForwardOptions in
	// output.bashtask.dev/v1alpha1 to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &BashTask{}, &LogOptions{}, &StdinOptions{}, &AttachOptions{}, &BashWorkspace{}, &PortForwardOptions{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
