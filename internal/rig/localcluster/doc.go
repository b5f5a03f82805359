// Package localcluster holds what a single-machine BashTask cluster needs
// besides its processes: a certificate authority with the controller's and
// the agents' key pairs, and the Kubernetes objects (Nodes, the agents'
// headless Service and its EndpointSlice) that describe agents listening on
// loopback addresses. bashtask-local and the test rigs use it, so local runs
// take the same code path as a cluster.
package localcluster
