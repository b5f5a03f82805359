// Package openapi holds the OpenAPI definitions the output API server
// serves and builds its server-side apply type converter from: those of
// output.bashtask.dev/v1alpha1 (api/output/v1alpha1) and of the
// apimachinery types they and discovery refer to. zz_generated.openapi.go
// is written by k8s.io/kube-openapi's openapi-gen (`make generate`); it
// lives outside api/ because it imports kube-openapi, which the API
// packages do not.
package openapi
