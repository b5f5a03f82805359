package agent

import (
	"time"
)

// The node's lease on its workspaces (executor.Lease; docs/workspaces.md,
// "Node lost"): a controller's Watch holds it while the stream is open and
// for the window the controller gave (WatchRequest.workspace_lease_ms)
// after it ends. The executor renews every workspace task's shim only
// while the lease runs a window ahead, so a workspace's tasks end on their
// own one window after the last Watch ended, or after this agent stopped,
// before the controller gives the node up and restores the workspace on
// another node.

// holdLease holds the lease with the given window (milliseconds; 0 or
// less holds nothing) until the returned function is called, which
// extends it one last window from then.
func (s *Server) holdLease(windowMs int64) (release func()) {
	if windowMs <= 0 {
		return func() {}
	}
	window := time.Duration(windowMs) * time.Millisecond
	// A quarter window between extensions: the lease always runs more than
	// one window ahead while the stream is open, so the executor renews.
	extend := func() { s.lease.Extend(window, time.Now().Add(window+window/2)) }
	extend()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(window / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				extend()
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		// From the end of the stream: one window, no more.
		s.lease.Extend(window, time.Now().Add(window))
	}
}
