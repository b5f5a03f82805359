package executor

import "errors"

// ErrNoNetworkNamespace is the error of Workspace.DialLoopback for a
// workspace without a network namespace of its own (NetworkNode): its
// loopback is the node's, which a dial must not reach
// (docs/portforward.md).
var ErrNoNetworkNamespace = errors.New("the workspace has no network namespace of its own (network Node): its loopback is the node's")
