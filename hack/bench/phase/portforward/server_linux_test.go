package portforward

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestServerBacklogAndNoDelay runs the phase's server on the host and
// checks the two settings that kept its figures from measuring the
// port-forward: the listen backlog of both ports (Python's default of 5
// dropped the SYNs of connections arriving at once, each then costing the
// client's 1 s retransmission) and TCP_NODELAY on a served connection
// (without it the body waited for the headers' delayed ACK, 40 ms).
func TestServerBacklogAndNoDelay(t *testing.T) {
	for _, tool := range []string{"python3", "ss"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	bp, hp := freePort(t), freePort(t)
	srv := startServer(t, bp, hp)
	for _, port := range []int{bp, hp} {
		if got := socketBacklog(t, port); got < listenBacklog {
			t.Errorf("port %d listens with a backlog of %d, want at least %d", port, got, listenBacklog)
		}
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", hp))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The kept connection is still open on the server's side.
	nodelay, delayed := tcpNoDelayOfConnections(t, srv.Process.Pid)
	if nodelay == 0 || delayed != 0 {
		t.Errorf("the server's connections: %d with TCP_NODELAY, %d without; want every one with it", nodelay, delayed)
	}
}

// startServer runs ServerScript in a temporary directory until it prints
// Serving; the test's end kills it.
func startServer(t *testing.T, bytesPort, httpPort int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("bash", "-c", ServerScript(bytesPort, httpPort))
	cmd.Dir = t.TempDir()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, "Serving") {
		t.Fatalf("the server did not start: %q, %v", line, err)
	}
	return cmd
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// socketBacklog is the backlog of the socket listening on 127.0.0.1:port,
// which ss prints as the Send-Q of a listening socket.
func socketBacklog(t *testing.T, port int) int {
	t.Helper()
	out, err := exec.Command("ss", "-ltnH", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) < 3 {
		t.Fatalf("ss: nothing listens on port %d: %q", port, out)
	}
	n, err := strconv.Atoi(f[2])
	if err != nil {
		t.Fatalf("ss: %q: %v", out, err)
	}
	return n
}

// tcpNoDelayOfConnections counts process pid's connected TCP sockets with
// and without TCP_NODELAY, reading each through a copy of its descriptor
// (pidfd_getfd(2)).
func tcpNoDelayOfConnections(t *testing.T, pid int) (nodelay, delayed int) {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(pidfd)
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			continue // closed meanwhile, or not ours to copy
		}
		on, ok := connectedTCPNoDelay(fd)
		unix.Close(fd)
		switch {
		case !ok:
		case on:
			nodelay++
		default:
			delayed++
		}
	}
	return nodelay, delayed
}

// connectedTCPNoDelay reports TCP_NODELAY of fd; ok is false when fd is
// not a TCP socket or is a listening one.
func connectedTCPNoDelay(fd int) (on, ok bool) {
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil || proto != unix.IPPROTO_TCP {
		return false, false
	}
	if l, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || l != 0 {
		return false, false
	}
	v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
	return err == nil && v != 0, err == nil
}
