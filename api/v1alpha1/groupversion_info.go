// Package v1alpha1 holds the bashtask.dev/v1alpha1 API: the BashTask kind,
// a shell command run on a cluster node by the bashtask-operator.
//
// The package imports only apimachinery so that clients (kubectl plugins,
// agent platforms) can depend on it without pulling in the controller.
//
// +kubebuilder:object:generate=true
// +groupName=bashtask.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "bashtask.dev", Version: "v1alpha1"}

	// SchemeBuilder collects the functions that register this package's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds BashTask, BashWorkspace and their lists to a
	// runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &BashTask{}, &BashTaskList{}, &BashWorkspace{}, &BashWorkspaceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
