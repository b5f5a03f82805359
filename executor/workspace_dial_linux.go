//go:build linux

package executor

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DialLoopback opens a TCP connection to 127.0.0.1:port inside the
// workspace's network namespace, and nowhere else (docs/portforward.md):
// the socket is made on an OS thread locked to the goroutine and moved
// into the namespace for the dial only, then moved back. The namespace's
// descriptor is duplicated under the workspace's lock, so a Close meanwhile
// cannot hand the dial another descriptor. The error wraps
// ErrNoNetworkNamespace for NetworkNode, and the dial's error (for example
// ECONNREFUSED when nobody listens) otherwise.
func (w *Workspace) DialLoopback(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: must be 1-65535", port)
	}
	fd, err := w.dupNetNS()
	if err != nil {
		return nil, err
	}
	ns := netns.NsHandle(fd)
	defer ns.Close()
	return dialIn(ctx, ns, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// dupNetNS duplicates the workspace's network namespace descriptor.
func (w *Workspace) dupNetNS() (int, error) {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.closed {
		return -1, fmt.Errorf("workspace %s is closed", w.id)
	}
	if w.sys.ns < 0 {
		return -1, ErrNoNetworkNamespace
	}
	fd, err := unix.FcntlInt(uintptr(w.sys.ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("duplicating the network namespace of workspace %s: %w", w.id, err)
	}
	return fd, nil
}

// dialIn dials addr from network namespace ns. The socket belongs to the
// namespace it was made in, so only the dial runs there; the thread goes
// back to the caller's namespace before it is unlocked (a thread that
// cannot go back stays locked, and the runtime ends it with the
// goroutine).
func dialIn(ctx context.Context, ns netns.NsHandle, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("reading the agent's network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("entering the workspace's network namespace: %w", err)
	}
	var d net.Dialer
	conn, dialErr := d.DialContext(ctx, "tcp4", addr)
	if err := netns.Set(orig); err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("returning to the agent's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}
