//go:build linux

package executor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// nodeExposure is a node's own socket and device as a task could find
// them: a root-owned 0666 Unix socket under /run, a world-readable block
// device node outside /dev (a copy of loop0's numbers, mode 0444), and a
// second 0666 socket under /run that the agent lists (Config.RunPaths).
type nodeExposure struct {
	socket, listed, device string
}

// exposeNode makes the socket, the listed socket and the device; they
// are removed at cleanup.
func exposeNode(t *testing.T) nodeExposure {
	t.Helper()
	n := nodeExposure{
		socket: fmt.Sprintf("/run/bashtask-test-%d-%s.sock", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")),
		listed: fmt.Sprintf("/run/bashtask-test-%d-%s-listed.sock", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")),
	}
	for _, path := range []string{n.socket, n.listed} {
		testutil.ListenNodeSocket(t, path)
	}
	// Outside /tmp, which the task sees a private one of.
	dir, err := os.MkdirTemp("/var/tmp", "bashtask-dev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n.device = filepath.Join(dir, "loop")
	testutil.MknodWorldReadableBlock(t, n.device)
	return n
}

// probe is a script printing "label: result" for the socket, the listed
// socket and the device: "connected" or "opened", or the error's text.
func (n nodeExposure) probe() string {
	return fmt.Sprintf(`/usr/bin/python3 -c '
import os, socket
for label, path in (("socket", %q), ("listed", %q)):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path); print(label + ": connected")
    except OSError as e:
        print(label + ": " + os.strerror(e.errno))
try:
    os.close(os.open(%q, os.O_RDONLY)); print("device: opened")
except OSError as e:
    print("device: " + os.strerror(e.errno))
'`, n.socket, n.listed, n.device)
}

// probeLabels parses "label: value" lines.
func probeLabels(out string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			m[k] = v
		}
	}
	return m
}

// A node's own root-owned 0666 socket under /run and a world-readable
// block device outside /dev are the node's permissions: a plain process
// of another UID connects and opens them (the control). A tenant task,
// whatever its network and a workspace's too, has a /run of its own, where
// only the listed socket (Config.RunPaths) is, and every mount it reaches
// is nodev: the connect finds no socket and the open is refused with
// EACCES.
func TestTenantNodeSocketsAndDevices(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the probe needs /usr/bin/python3")
	}
	n := exposeNode(t)
	cmd := exec.CommandContext(t.Context(), "/bin/bash", "-c", n.probe())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	host := probeLabels(out.String())
	if host["socket"] != "connected" || host["listed"] != "connected" || host["device"] != "opened" {
		t.Skipf("control: a plain process of UID 65534 does not reach the node's socket and device (%v): nothing to hide", host)
	}
	ex := tenantExecutor(t, func(c *Config) { c.RunPaths = []string{n.listed, "/run/bashtask-test-absent.sock"} })
	want := map[string]string{"socket": "No such file or directory", "listed": "connected", "device": "Permission denied"}
	check := func(t *testing.T, res Result) {
		t.Helper()
		if res.Reason != ReasonSucceeded {
			t.Fatalf("%s: %s\n%s", res.Reason, res.Message, res.Stderr.Tail)
		}
		got := probeLabels(res.Stdout.Tail)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %q, want %q (all: %v)", k, got[k], v, got)
			}
		}
	}
	for _, network := range []Network{NetworkNode, NetworkNone} {
		t.Run(string(network), func(t *testing.T) {
			spec := testSpec(t, n.probe())
			uid := tenantTestUIDs.Add(1)
			spec.User, spec.Network = &User{UID: uid, GID: uid}, network
			check(t, run(t, ex, spec))
		})
	}
	t.Run("workspace", func(t *testing.T) {
		w := testWorkspace(t, ex, NetworkNone, false)
		check(t, run(t, ex, wsSpec(t, w, n.probe(), "", false)))
	})
}

// The task's own /dev holds the usual device files, which work, the
// links to the standard streams, and nothing else of the node's; every
// mount but those device files and /dev/pts is nodev.
func TestTenantDev(t *testing.T) {
	t.Parallel()
	ex := tenantExecutor(t)
	spec := testSpec(t, strings.Join([]string{
		`echo ls=$(ls /dev | tr '\n' ' ')`,
		`echo hi > /dev/null && echo null=ok`,
		`echo zero=$(head -c 4 /dev/zero | od -An -tx1 | tr -d ' ')`,
		`echo urandom=$(head -c 16 /dev/urandom | wc -c)`,
		`echo random=$(head -c 16 /dev/random | wc -c)`,
		`echo x 2>/dev/null > /dev/full || echo full=refused`,
		`(: < /dev/tty) 2>&1 | sed 's/.*: /tty=/'`,
		`test -c /dev/stdin && echo stdin=char`,
		`echo substitution=$(cat <(echo ok))`,
		`echo shm=$(stat -f -c %T /dev/shm) $(touch /dev/shm/x && echo shmwrite=ok)`,
		`touch /dev/x 2>/dev/null && echo dev=writable || echo dev=denied`,
		// Mount options are field 6 of mountinfo, the mount point field
		// 5: the mounts without nodev that are no device file.
		`echo withdev=$(awk '$6 !~ /(^|,)nodev(,|$)/ {print $5}' /proc/self/mountinfo | while read m; do [ -c "$m" ] || echo "$m"; done | tr '\n' ' ')`,
		`echo devbinds=$(awk '$6 !~ /(^|,)nodev(,|$)/ && $5 ~ /^\/dev\// {print $5}' /proc/self/mountinfo | sort | tr '\n' ' ')`,
	}, "; "))
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("%s: %s\n%s", res.Reason, res.Message, res.Stderr.Tail)
	}
	var wantDev []string
	for _, d := range []string{"full", "null", "ptmx", "pts", "random", "tty", "urandom", "zero"} {
		if _, err := os.Stat("/dev/" + d); err == nil {
			wantDev = append(wantDev, "/dev/"+d)
		}
	}
	withDev := ""
	if fi, err := os.Stat("/dev/pts"); err == nil && fi.IsDir() {
		withDev = "/dev/pts"
	}
	for _, want := range []string{
		"null=ok\n", "zero=00000000\n", "urandom=16\n", "random=16\n", "full=refused\n",
		"tty=No such device or address\n", "stdin=char\n", "substitution=ok\n",
		"shm=tmpfs shmwrite=ok\n", "dev=denied\n",
		"withdev=" + withDev + "\n",
		"devbinds=" + strings.Join(wantDev, " ") + "\n",
	} {
		if !strings.Contains(res.Stdout.Tail, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, res.Stdout.Tail, res.Stderr.Tail)
		}
	}
	for _, absent := range []string{"loop0", "vda", "kmsg", "mem", "kvm"} {
		if strings.Contains(res.Stdout.Tail, " "+absent+" ") {
			t.Errorf("the task's /dev lists the node's %s:\n%s", absent, res.Stdout.Tail)
		}
	}
}

// A run path that is not a clean absolute path below /run is refused by
// New, naming it.
func TestRunPathsValidated(t *testing.T) {
	for _, p := range []string{"run/x.sock", "/var/run/x.sock", "/run/../etc/shadow", "/run"} {
		_, err := New(Config{Cgroups: CgroupOff, Isolation: IsolationTenant, RunPaths: []string{p}})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), p) {
			t.Errorf("RunPaths %q: %v, want ErrInvalidConfig naming it", p, err)
		}
	}
}
