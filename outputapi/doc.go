// Package outputapi is the aggregated API server of output.bashtask.dev:
// GET .../namespaces/{ns}/bashtasks/{name}/log streams a task's stdout or
// stderr from any byte offset, following it while it runs, from the node's
// agent (ReadOutput over the controller's mTLS identity) or, once the agent
// has let it go, from the operator's bucket. kube-apiserver proxies the
// requests here (APIService v1alpha1.output.bashtask.dev); the server
// authenticates them by delegation (the front proxy's client certificate)
// and authorizes them with SubjectAccessReviews, as pods/log is: RBAC names
// `get` on `bashtasks/log` in the group output.bashtask.dev. docs/output.md
// is the contract.
//
// The wire contract (the API types, query parameters, headers, trailers,
// stdin reasons and size limits) is api/output/v1alpha1, shared with the
// Go client (package client); the OpenAPI definitions served are
// generated into outputapi/openapi.
package outputapi
