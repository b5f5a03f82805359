package testutil

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// ListenNodeSocket listens on the Unix socket path with mode 0666, as a
// node daemon's open socket is, accepting and closing every connection
// until the test ends: the target of the tenant tests that a task cannot
// reach the node's sockets. A node where it cannot be made (not root, no
// such directory) skips the test, except under StrictEnv.
func ListenNodeSocket(t testing.TB, path string) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		SkipUnlessStrictf(t, "a node socket at %s: %v", path, err)
		return
	}
	t.Cleanup(func() { _ = lis.Close() })
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
}

// MknodWorldReadableBlock makes path a block device node of the first loop
// device (7:0) readable by everyone, as a node may leave one outside
// /dev; it is removed when the test ends. Without CAP_MKNOD the test is
// skipped, except under StrictEnv.
func MknodWorldReadableBlock(t testing.TB, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFBLK|0o444, int(unix.Mkdev(7, 0))); err != nil {
		SkipUnlessStrictf(t, "mknod of a block device at %s: %v", path, err)
		return
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
}
