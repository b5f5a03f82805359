// Package agentpool holds the controller's connections to the node agents:
// the AgentRegistry (one mTLS gRPC connection and one Watch stream per
// agent, on the leader), the AgentReaders (connections for the output
// API's reads and stdin writes, on every replica), the leader fence sent
// with each call that acts on a node (LeaderFence), and the one dial
// policy they share (dial.go).
//
// It may import api/ and the Kubernetes libraries; the reconcilers
// (controllers) and the output API (outputapi) import it, never the other
// way round. The reconcilers define the interfaces they consume
// (controllers.Agents, controllers.WorkspaceAgents); AgentRegistry
// implements them.
package agentpool
