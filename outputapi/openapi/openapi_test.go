package openapi

import (
	"testing"

	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// TestDefinitionsComplete: every schema a definition refers to is defined,
// as the server's OpenAPI builder and its server-side apply type
// converter require, and the API's types keep the model names clients see
// in the served document.
func TestDefinitionsComplete(t *testing.T) {
	defs := GetOpenAPIDefinitions(func(path string) spec.Ref { return spec.MustCreateRef("#/definitions/" + path) })
	for name, d := range defs {
		for _, dep := range d.Dependencies {
			if _, ok := defs[dep]; !ok {
				t.Errorf("%s refers to %s, which is not defined", name, dep)
			}
		}
	}
	for _, name := range []string{
		"dev.bashtask.output.v1alpha1.BashTask",
		"dev.bashtask.output.v1alpha1.BashTaskOutputStatus",
		"dev.bashtask.output.v1alpha1.LogOptions",
		"dev.bashtask.output.v1alpha1.StdinOptions",
		"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
		"io.k8s.apimachinery.pkg.apis.meta.v1.Status",
	} {
		if _, ok := defs[name]; !ok {
			t.Errorf("no definition of %s", name)
		}
	}
	var _ common.GetOpenAPIDefinitions = GetOpenAPIDefinitions
}
