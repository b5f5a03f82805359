// Package tlsutil holds the mutual-TLS plumbing shared by the agent and the
// controller: certificate files that are re-read when they change on disk,
// server and client tls.Config builders that refuse a peer before any RPC
// when its certificate does not chain to the cluster CA or does not carry the
// expected identity, and a small certificate authority for tests and the
// local launcher.
//
// There is deliberately no plaintext or "insecure" mode: the agent protocol
// requires mTLS both ways (docs/agent.md, Security).
package tlsutil
