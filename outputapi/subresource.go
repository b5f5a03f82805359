package outputapi

import "k8s.io/apimachinery/pkg/runtime"

// subresource is what the output API's connect subresources (log, stdin,
// attach, portforward) tell the REST machinery besides Connect, which
// each serves its own way: namespaced, the singular name of the resource
// it belongs to, the HTTP methods it takes and its options type, decoded
// from the query (NewScheme).
type subresource struct {
	singular   string
	methods    []string
	newOptions func() runtime.Object
}

// newSubresource describes a subresource of the resource singular whose
// options newOptions makes, taking methods.
func newSubresource(singular string, newOptions func() runtime.Object, methods ...string) subresource {
	return subresource{singular: singular, methods: methods, newOptions: newOptions}
}

// New implements rest.Storage.
func (s subresource) New() runtime.Object { return s.newOptions() }

// Destroy implements rest.Storage: nothing is held.
func (subresource) Destroy() {}

// NamespaceScoped implements rest.Scoper: every resource of the group is.
func (subresource) NamespaceScoped() bool { return true }

// GetSingularName implements rest.SingularNameProvider.
func (s subresource) GetSingularName() string { return s.singular }

// ConnectMethods implements rest.Connecter.
func (s subresource) ConnectMethods() []string { return s.methods }

// NewConnectOptions implements rest.Connecter: the options, no subpath.
func (s subresource) NewConnectOptions() (runtime.Object, bool, string) {
	return s.newOptions(), false, ""
}
