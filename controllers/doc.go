// Package controllers holds the BashTask reconciler: it schedules each task
// onto a node's agent, dispatches it at most once, follows the agent's
// events into status, and handles cancellation, deletion and TTL.
//
// The RBAC markers below are the controller's whole set of permissions;
// `make manifests` turns them into config/rbac/role.yaml.
//
// Secrets and ConfigMaps are read with get only, through an uncached reader,
// so the controller never lists or caches every credential in the cluster.
//
// +kubebuilder:rbac:groups=bashtask.dev,resources=bashtasks,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=bashtask.dev,resources=bashtasks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=bashtask.dev,resources=bashtasks/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets;configmaps,verbs=get
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
package controllers
