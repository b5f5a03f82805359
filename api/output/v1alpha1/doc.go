// Package v1alpha1 holds the wire contract of output.bashtask.dev/v1alpha1,
// the aggregated API that serves a BashTask's output (bashtasks/log) and
// takes its streamed standard input (bashtasks/stdin): the API types, the
// query parameters, the response headers and trailers, the reasons of a
// closed input and the size limits of a request. The server
// (package outputapi) and the Go client (package client) both import it,
// so that the contract has one spelling. docs/output.md and docs/stdin.md
// describe it.
//
// The package imports only apimachinery so that clients can depend on it
// without pulling in the server.
//
// Its types are served by the aggregated API server, not by a CRD:
// kubebuilder:skip keeps controller-gen's CRD generator away from them.
//
// +kubebuilder:skip
// +kubebuilder:object:generate=true
// +k8s:openapi-gen=true
// +k8s:openapi-model-package=dev.bashtask.output.v1alpha1
// +groupName=output.bashtask.dev
package v1alpha1
