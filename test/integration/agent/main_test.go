// Package agent_test runs the bashtask-agent binary as a real process over
// mTLS on loopback: restart recovery after SIGKILL (case C30) and uploads to
// a real S3 server, versitygw built by hack/setup-s3.sh (case C23, upload
// failure and recovery).
package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

var (
	// agentBin is the bashtask-agent binary built by TestMain.
	agentBin string
	// repoRoot is the module's root directory.
	repoRoot string
)

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		fmt.Fprintln(os.Stderr, "agent integration tests: cannot locate the module root:", err)
		return 1
	}
	repoRoot = filepath.Dir(strings.TrimSpace(string(out)))
	dir, err := os.MkdirTemp("", "bashtask-agent-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBin = filepath.Join(dir, "bashtask-agent")
	build := exec.Command("go", "build", "-o", agentBin, "./cmd/bashtask-agent")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent integration tests: building bashtask-agent failed:", err)
		return 1
	}
	return m.Run()
}

// pki is a CA with the agent's server certificate and a controller client
// certificate, written to files.
type pki struct {
	dir                   string
	caFile                string
	serverCert, serverKey string
	clientCert, clientKey string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsutil.NewCA("bashtask-test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: dir, caFile: filepath.Join(dir, "ca.crt")}
	if err := tlsutil.WriteFileAtomic(p.caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(tlsutil.LeafOptions{CommonName: "agent", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.serverCert, p.serverKey, err = srv.WriteFiles(dir, "server"); err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Issue(tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.clientCert, p.clientKey, err = cli.WriteFiles(dir, "client"); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentProc is a running bashtask-agent process.
type agentProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
	logs *syncbuf.Buffer
}

// startAgent runs the agent on a loopback port chosen by the kernel and
// returns once it serves (it logs the address it listens on).
func startAgent(t *testing.T, p *pki, stateDir, bucketURL string, env []string, extra ...string) *agentProc {
	t.Helper()
	args := []string{
		"--listen", "127.0.0.1:0",
		"--node-name", "node-it", "--pod-name", "agent-it",
		"--state-dir", stateDir,
		"--output-bucket-url", bucketURL,
		"--progress-interval", "100ms",
		"--tls-cert-file", p.serverCert, "--tls-key-file", p.serverKey, "--tls-ca-file", p.caFile,
		"--metrics-address", "", "--health-probe-address", "",
		"--cgroup-parent", fmt.Sprintf("bashtask-agent-it-%d", os.Getpid()), // one per test run: an agent at the tenant level empties the pooled shims' cgroups under its parent
		"--log-format", "json",
	}
	cmd := exec.Command(agentBin, append(args, extra...)...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, done: make(chan struct{}), logs: &syncbuf.Buffer{}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			fmt.Fprintf(a.logs, "%s\n", line)
			var m struct {
				Msg    string `json:"msg"`
				Listen string `json:"listen"`
			}
			if json.Unmarshal(line, &m) == nil && m.Msg == "agent serving" {
				addrc <- m.Listen
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() { _ = cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.stop(t)
		if t.Failed() {
			t.Logf("agent (pid %d) log:\n%s", cmd.Process.Pid, a.logs.String())
		}
	})
	select {
	case a.addr = <-addrc:
	case <-a.done:
		t.Fatalf("agent exited before serving:\n%s", a.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("agent not serving after 30 s:\n%s", a.logs.String())
	}
	return a
}

// stop ends the agent with SIGTERM, then SIGKILL after 15 s.
func (a *agentProc) stop(t *testing.T) {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		t.Errorf("agent ignored SIGTERM for 15 s; killing it")
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// kill ends the agent with SIGKILL and waits for it.
func (a *agentProc) kill() {
	_ = a.cmd.Process.Kill()
	<-a.done
}

// client dials the agent with the controller's certificate.
func (a *agentProc) client(t *testing.T, p *pki) agentv1.ExecutorClient {
	t.Helper()
	files, err := tlsutil.NewFiles(p.clientCert, p.clientKey, p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlsutil.ClientConfig(files, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentv1.NewExecutorClient(conn)
}

// watcher reads a Watch stream in the background.
type watcher struct {
	t      *testing.T
	info   *agentv1.AgentInfo
	events chan *agentv1.TaskEvent
}

func watch(t *testing.T, c agentv1.ExecutorClient) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	stream, err := c.Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{t: t, info: first.GetAgent(), events: make(chan *agentv1.TaskEvent, 1024)}
	go func() {
		defer close(w.events)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if ev := m.GetTask(); ev != nil {
				w.events <- ev
			}
		}
	}()
	return w
}

// until returns the first event for uid that satisfies ok, failing the test
// after timeout.
func (w *watcher) until(uid string, timeout time.Duration, what string, ok func(*agentv1.TaskEvent) bool) *agentv1.TaskEvent {
	w.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, open := <-w.events:
			if !open {
				w.t.Fatalf("watch ended while waiting for %s", what)
			}
			if ev.GetStatus().GetRef().GetUid() == uid && ok(ev) {
				return ev
			}
		case <-deadline:
			w.t.Fatalf("no %s of task %s within %v", what, uid, timeout)
		}
	}
}

func isType(t agentv1.EventType) func(*agentv1.TaskEvent) bool {
	return func(ev *agentv1.TaskEvent) bool { return ev.GetType() == t }
}

// tasksWithMarker returns the live (not zombie) processes whose environment
// carries BASHTASK_UID=uid.
func tasksWithMarker(uid string) []int {
	marker := []byte("BASHTASK_UID=" + uid)
	var out []int
	for _, pid := range procfs.PIDs() {
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		if err != nil || !containsEntry(env, marker) {
			continue
		}
		if alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

func containsEntry(environ, entry []byte) bool {
	for _, e := range bytes.Split(environ, []byte{0}) {
		if bytes.Equal(e, entry) {
			return true
		}
	}
	return false
}

// alive reports whether pid exists and is not a zombie (a zombie has died;
// only its parent has not collected it yet).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// versitygwBin returns bin/versitygw or fails the test: these tests need a
// real S3 server and must not pass silently without one.
func versitygwBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(repoRoot, "bin", "versitygw")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("versitygw is missing (%v): build it with `make setup-s3` (hack/setup-s3.sh) before running these tests", err)
	}
	return bin
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var errNotYet = errors.New("not yet")
