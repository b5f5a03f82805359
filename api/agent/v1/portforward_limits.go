package agentv1

// MaxPortForwardChunkBytes is the most bytes one PortForwardRequest or
// PortForwardResponse carries (data), 32 KiB: the agent reads a forwarded
// connection into a buffer of this size and refuses a larger request
// chunk (docs/portforward.md).
const MaxPortForwardChunkBytes = 32 << 10

// MaxPortForwardsPerWorkspace is how many forwarded connections
// (PortForward.Forward calls) one workspace has open at most on its
// agent; one more is RESOURCE_EXHAUSTED naming the limit
// (docs/portforward.md).
const MaxPortForwardsPerWorkspace = 64
