//go:build unix

package plugin

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/tools/remotecommand"
)

// watchSize sends fd's size now and at every SIGWINCH until ctx ends.
func watchSize(ctx context.Context, fd int) remotecommand.TerminalSizeQueue {
	q := &sizeQueue{sizes: make(chan remotecommand.TerminalSize, 1)}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		defer close(q.sizes)
		defer signal.Stop(winch)
		last := remotecommand.TerminalSize{}
		for {
			if s, ok := localSize(fd); ok && s != last {
				select {
				case q.sizes <- s:
					last = s
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-winch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return q
}
