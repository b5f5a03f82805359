//go:build !unix

package plugin

import (
	"context"

	"k8s.io/client-go/tools/remotecommand"
)

// watchSize sends fd's size once: without SIGWINCH no change is seen.
func watchSize(ctx context.Context, fd int) remotecommand.TerminalSizeQueue {
	q := &sizeQueue{sizes: make(chan remotecommand.TerminalSize, 1)}
	if s, ok := localSize(fd); ok {
		q.sizes <- s
	}
	go func() { <-ctx.Done(); close(q.sizes) }()
	return q
}
