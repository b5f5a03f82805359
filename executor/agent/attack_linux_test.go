//go:build linux

package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// The attack suite of the tenant level: two owners' tasks, A and B, on one
// agent; each test is a row of what A tries against B, the agent and the
// node, with the outcome the tenant level guarantees. The agent's files
// live outside /tmp, as on a node (/var/lib/bashtask-agent,
// /etc/bashtask-agent/tls), so that the private /tmp does not hide them by
// accident.

// attackTmpSize is the private /tmp size of the suite's tasks (bytes).
const attackTmpSize = 8 << 20

// attackProcs is the suite's process limit per task: the default, 4096,
// would let the fork bomb row start thousands of shells on a shared CI
// machine; the mechanism (RLIMIT_NPROC on the task's UID, or pids.max) is
// the same.
const attackProcs = 256

type attackRig struct {
	*rig
	base      string // the agent's files: state/, tls/, aws/
	tlsKey    string
	awsCreds  string
	setuidBin string
	// listedSock is the path under /run the agent lets tasks reach
	// (--task-run-paths); nothing is there until a row listens on it.
	listedSock string
}

const (
	tlsKeyContent  = "-----BEGIN PRIVATE KEY----- agent-tls-key"
	awsCredContent = "aws_secret_access_key = bucket-secret"
)

func newAttackRig(t *testing.T, first, last uint32) *attackRig {
	t.Helper()
	base, err := os.MkdirTemp("/var/tmp", "bashtask-attack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	a := &attackRig{base: base,
		tlsKey:     filepath.Join(base, "tls", "tls.key"),
		awsCreds:   filepath.Join(base, "aws", "credentials"),
		listedSock: fmt.Sprintf("/run/bashtask-attack-%d-listed.sock", os.Getpid()),
	}
	// World-readable on purpose, as a Secret volume's files are by
	// default: what hides them is the mask, not the mode.
	for path, content := range map[string]string{a.tlsKey: tlsKeyContent, a.awsCreds: awsCredContent} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A setuid-root copy of id, where a task can run it.
	a.setuidBin = filepath.Join(base, "bin", "id-setuid")
	if err := os.MkdirAll(filepath.Dir(a.setuidBin), 0o755); err != nil {
		t.Fatal(err)
	}
	idBin, err := os.ReadFile("/usr/bin/id")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.setuidBin, idBin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(a.setuidBin, 0o4755); err != nil {
		t.Fatal(err)
	}
	workRoot := filepath.Join(base, "work")
	if err := os.Mkdir(workRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", a.awsCreds)
	a.rig = newRig(t, tenantLevel(first, last), func(c *Config) {
		c.StateDir = filepath.Join(base, "state")
		c.Executor.WorkDirRoot = workRoot
		c.Executor.TmpSizeBytes = attackTmpSize
		c.Executor.TaskProcs = attackProcs
		c.Executor.MaskPaths = []string{filepath.Dir(a.tlsKey)} // as serve.go does for --tls-key-file
		c.Executor.RunPaths = []string{a.listedSock}
		// Network Egress with an ID and a task range of this process's
		// own (the executor package's tests take 100.64.0.0/11).
		pid := os.Getpid()
		c.Executor.Egress = &executor.EgressConfig{ID: fmt.Sprintf("a%x", pid%(1<<24)),
			CIDR: fmt.Sprintf("100.%d.%d.0/24", 96+(pid>>8)%32, pid%256), Resolvers: []string{"192.0.2.53"}}
	})
	return a
}

// start starts a task and waits until its stdout has ready.
func (a *attackRig) start(uid, command, network string, env ...*agentv1.EnvVar) {
	a.t.Helper()
	spec := taskSpec(uid, command)
	spec.Network, spec.Env = network, env
	if _, err := a.client.Start(a.t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		a.t.Fatal(err)
	}
}

// get returns the task's status.
func (a *attackRig) get(uid string) *agentv1.TaskStatus {
	a.t.Helper()
	resp, err := a.client.Get(a.t.Context(), &agentv1.GetRequest{Uid: uid})
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.GetStatus()
}

// waitOutput waits until the task's stdout contains want.
func (a *attackRig) waitOutput(uid, want string) {
	a.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(a.get(uid).GetStdout().GetTail(), want) {
		if time.Now().After(deadline) {
			a.t.Fatalf("task %s: no %q in stdout %q", uid, want, a.get(uid).GetStdout().GetTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finish waits for the task's end.
func (a *attackRig) finish(uid string) *agentv1.TaskStatus {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := a.get(uid)
		if st.GetState() == agentv1.TaskState_TASK_STATE_FINISHED {
			return st
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("task %s did not finish: %v", uid, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run runs a task to its end.
func (a *attackRig) run(uid, command, network string) *agentv1.TaskStatus {
	a.t.Helper()
	a.start(uid, command, network)
	return a.finish(uid)
}

// nodeAddress is a non-loopback IPv4 address of the host, where a
// listener on the wildcard address answers.
func nodeAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Skip("the host has no non-loopback IPv4 address")
	return ""
}

// victim is B's task: files in its working directory, /tmp and /dev/shm,
// a Secret value in its environment, and its shell waiting.
type victim struct {
	uid      string
	workDir  string
	shimPID  int // host pid of B's shim
	shellPID int // host pid of B's shell
}

const victimSecret = "b-secret-value-7f3a"

func (a *attackRig) startVictim(uid string) victim {
	a.t.Helper()
	a.start(uid, `echo b-work > secret; echo b-tmp > /tmp/x; echo b-shm > /dev/shm/y; echo ready; sleep 40`, "",
		&agentv1.EnvVar{Name: "B_SECRET", Value: victimSecret})
	a.waitOutput(uid, "ready")
	a.srv.mu.Lock()
	p := a.srv.tasks[uid].rec.Process
	a.srv.mu.Unlock()
	v := victim{uid: uid, workDir: p.WorkDir, shimPID: p.PID}
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.PID, p.PID))
	if err != nil {
		a.t.Fatal(err)
	}
	if v.shellPID, err = strconv.Atoi(strings.Fields(string(children))[0]); err != nil {
		a.t.Fatal(err)
	}
	return v
}

func stdoutOf(st *agentv1.TaskStatus) string { return st.GetStdout().GetTail() }

func TestAttackSuite(t *testing.T) {
	a := newAttackRig(t, 2200000, 2200002)
	b := a.startVictim("b")
	defer func() {
		// B was unaffected by every row: still running, then cancelled
		// with its normal reason.
		if st := a.get(b.uid); st.GetState() != agentv1.TaskState_TASK_STATE_RUNNING {
			t.Errorf("B is no longer running after the attacks: %v", st)
		}
		if _, err := a.client.Cancel(t.Context(), &agentv1.CancelRequest{Uid: b.uid}); err != nil {
			t.Fatal(err)
		}
		if st := a.finish(b.uid); st.GetReason() != "Cancelled" {
			t.Errorf("B ended %s, want Cancelled", st.GetReason())
		}
	}()
	seq := 0
	attack := func(command string) *agentv1.TaskStatus {
		t.Helper()
		seq++
		st := a.run(fmt.Sprintf("a-%d", seq), command, "")
		if st.GetIsolation().GetLevel() != "tenant" {
			t.Fatalf("attacker ran at level %q", st.GetIsolation().GetLevel())
		}
		return st
	}
	expectEach := func(t *testing.T, out string, want map[string]string) {
		t.Helper()
		for label, w := range want {
			if !strings.Contains(out, label+": "+w) {
				t.Errorf("%s: want %q in\n%s", label, w, out)
			}
		}
	}

	t.Run("C35 A reads B's files in its working directory, /tmp and /dev/shm", func(t *testing.T) {
		out := stdoutOf(attack(fmt.Sprintf(`
r() { echo "$1: $( { eval "$2" >/dev/null; } 2>&1 | sed 's/.*: //')"; }
r workdir-file 'cat %[1]s/secret'
r workdir-list 'ls %[1]s'
r tmp 'cat /tmp/x'
r shm 'cat /dev/shm/y'`, b.workDir)))
		expectEach(t, out, map[string]string{
			"workdir-file": "Permission denied", "workdir-list": "Permission denied",
			"tmp": "No such file or directory", "shm": "No such file or directory",
		})
	})

	t.Run("C33 A reads B's environ and cmdline in /proc and lists /proc", func(t *testing.T) {
		out := stdoutOf(attack(fmt.Sprintf(`
r() { echo "$1: $( { eval "$2" >/dev/null; } 2>&1 | sed 's/.*: //')"; }
r environ 'cat /proc/%[1]d/environ'
r cmdline 'cat /proc/%[1]d/cmdline'
r shim-environ 'cat /proc/%[2]d/environ'
echo "grep: $(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c %[3]s)"
echo "others: $(for p in /proc/[0-9]*; do [ "$(stat -c %%u $p)" = "$(id -u)" ] || echo $p; done | wc -l)"
echo "count: $(ls -d /proc/[0-9]* | wc -l)"`, b.shellPID, b.shimPID, victimSecret)))
		expectEach(t, out, map[string]string{
			"environ": "No such file or directory", "cmdline": "No such file or directory",
			"shim-environ": "No such file or directory", "grep": "0", "others": "0",
		})
	})

	t.Run("C34 A kills B's shell and every process it can (kill -9 -1)", func(t *testing.T) {
		st := attack(fmt.Sprintf(`sleep 30 & kill -9 %d; echo "kill-b: $?"; own=$!; kill -9 -1; echo "kill-all: $?"; wait $own; echo "own sleep: $?"`, b.shellPID))
		out := stdoutOf(st)
		// B's pid does not exist in A's namespace; kill -1 reaches only A's
		// own sleep; A's shell goes on and ends with its normal reason.
		expectEach(t, out, map[string]string{"kill-b": "1", "kill-all": "0", "own sleep": "137"})
		if !strings.Contains(st.GetStderr().GetTail(), "No such process") || st.GetReason() != "Succeeded" {
			t.Errorf("A: %s, stderr %q", st.GetReason(), st.GetStderr().GetTail())
		}
	})

	t.Run("A attaches ptrace to its own process and to B", func(t *testing.T) {
		out := stdoutOf(attack(fmt.Sprintf(`
sleep 30 & own=$!
/usr/bin/python3 -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for label, pid in (("own", int(sys.argv[1])), ("b", int(sys.argv[2]))):
    r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    print("%%s: %%s" %% (label, os.strerror(ctypes.get_errno()) if r != 0 else "attached"))
' $own %d
echo "gdb: $(/usr/bin/gdb -batch -p $own 2>&1 | grep -o 'Operation not permitted' | head -1)"
kill $own`, b.shellPID)))
		// The filter refuses ptrace before the kernel looks the pid up.
		expectEach(t, out, map[string]string{"own": "Operation not permitted", "b": "Operation not permitted", "gdb": "Operation not permitted"})
	})

	t.Run("A calls unshare and keyctl through the 32-bit system-call entry", func(t *testing.T) {
		if runtime.GOARCH != "amd64" {
			t.Skip("the int 0x80 entry is x86-64's; other architectures' compat entries are refused by the same first check of the filter")
		}
		// Machine code run from an executable mapping: mov eax, nr; mov
		// ebx, arg; int 0x80; ret. i386 numbers: unshare 310, keyctl 288.
		out := stdoutOf(attack(`
/usr/bin/python3 -c '
import ctypes, mmap, os, struct
def int80(nr, arg):
    code = b"\xb8" + struct.pack("<I", nr) + b"\xbb" + struct.pack("<I", arg) + b"\xcd\x80\xc3"
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    r = f()
    return "succeeded" if r == 0 else os.strerror(-r)
print("unshare-user: " + int80(310, 0x10000000))
print("keyctl: " + int80(288, 0))
'`))
		expectEach(t, out, map[string]string{"unshare-user": "Function not implemented", "keyctl": "Function not implemented"})
	})

	t.Run("A queues fault signals to its shim", func(t *testing.T) {
		if runtime.GOARCH != "amd64" {
			t.Skip("the system-call numbers below are x86-64's; the filter names the calls, so other architectures get the same rules")
		}
		// A signal that does not carry kill's code (SI_QUEUE here, a kernel
		// code through F_SETSIG) is one the Go runtime takes for a fault of
		// its own: SIGSEGV queued to the shim would crash it. The filter
		// refuses each way to queue one to PID 1; queueing to the task's
		// own processes still works.
		st := attack(`
/usr/bin/python3 -c '
import ctypes, os, signal, struct
libc = ctypes.CDLL(None, use_errno=True)
info = ctypes.create_string_buffer(128)
struct.pack_into("<iii", info, 0, signal.SIGSEGV, 0, -1)
def r(label, rc):
    print("%s: %s" % (label, os.strerror(ctypes.get_errno()) if rc < 0 else "succeeded"))
r("sigqueue", libc.syscall(129, 1, signal.SIGSEGV, info))
r("tgsigqueue", libc.syscall(297, 1, 1, signal.SIGSEGV, info))
fd = libc.syscall(434, 1, 0)
r("pidfd", libc.syscall(424, fd, signal.SIGSEGV, info, 0) if fd >= 0 else fd)
r("setsig", libc.fcntl(0, 10, signal.SIGSEGV))
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
struct.pack_into("<iii", info, 0, signal.SIGUSR1, 0, -1)
r("own", libc.syscall(129, os.getpid(), signal.SIGUSR1, info))
print("own-delivered: %d" % len(got))
'
sleep 0.2; echo alive`)
		out := stdoutOf(st)
		expectEach(t, out, map[string]string{"sigqueue": "Operation not permitted", "tgsigqueue": "Operation not permitted",
			"pidfd": "Operation not permitted", "setsig": "Operation not permitted", "own": "succeeded", "own-delivered": "1"})
		if st.GetReason() != "Succeeded" || !strings.Contains(out, "alive") {
			t.Errorf("the task ended %s %q: its shim did not survive", st.GetReason(), st.GetMessage())
		}
	})

	t.Run("A reads the agent's TLS key, journal, B's spill file and the bucket credentials", func(t *testing.T) {
		state := filepath.Join(a.base, "state")
		out := stdoutOf(attack(fmt.Sprintf(`
r() { echo "$1: $( { eval "$2" | head -c 64; } 2>&1 | sed 's/.*: //')"; }
r tls-key 'cat %s'
r journal 'cat %s/*'
r spill 'cat %s'
r bucket-credentials 'cat %s'`, a.tlsKey, state, filepath.Join(state, "tasks", b.uid, "stdout"), a.awsCreds)))
		expectEach(t, out, map[string]string{
			"tls-key": "No such file or directory", "journal": "No such file or directory",
			"spill": "No such file or directory", "bucket-credentials": "", // /dev/null over the file: empty
		})
		for _, secret := range []string{tlsKeyContent, awsCredContent, "ready"} {
			if strings.Contains(out, secret) {
				t.Errorf("A read %q:\n%s", secret, out)
			}
		}
	})

	t.Run("A writes outside its working directory and /tmp", func(t *testing.T) {
		out := stdoutOf(attack(`
r() { echo "$1: $( { eval "$2"; } 2>&1 | sed 's/.*: //')"; }
r usr-bin 'echo x > /usr/bin/x'
r etc 'echo x > /etc/x'
r agent-work 'touch ` + filepath.Join(a.base, "work", "x") + `'
r own-workdir 'echo x > x && echo written'`))
		expectEach(t, out, map[string]string{
			"usr-bin": "Read-only file system", "etc": "Read-only file system",
			"agent-work": "Read-only file system", "own-workdir": "written",
		})
	})

	t.Run("C36 A with network None and Node connects to the agent's port and a node listener", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		_, agentPort, _ := net.SplitHostPort(a.addr)
		_, nodePort, _ := net.SplitHostPort(lis.Addr().String())
		cmd := fmt.Sprintf(`
c() { if (exec 3<>/dev/tcp/127.0.0.1/$2) 2>/dev/null; then echo "$1: connected"; else echo "$1: failed"; fi; }
c agent %s; c node %s; echo "links: $(ls /sys/class/net | tr '\n' ' ')"`, agentPort, nodePort)
		seq++
		none := a.run(fmt.Sprintf("a-%d", seq), cmd, "None")
		expectEach(t, stdoutOf(none), map[string]string{"agent": "failed", "node": "failed"})
		if got := none.GetIsolation(); got.GetNetwork() != "None" || !strings.Contains(strings.Join(got.GetNamespaces(), ","), "net") {
			t.Errorf("isolation of the None task: %v", got)
		}
		seq++
		node := a.run(fmt.Sprintf("a-%d", seq), cmd, "Node")
		expectEach(t, stdoutOf(node), map[string]string{"agent": "connected", "node": "connected"})
	})

	t.Run("A with network Egress connects to the agent's port, a node listener and the node's address", func(t *testing.T) {
		a.srv.mu.Lock()
		ex := a.srv.ex
		a.srv.mu.Unlock()
		if !ex.Capabilities().Egress {
			t.Skipf("no network Egress on this host: %v", ex.EgressError())
		}
		lis, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		_, agentPort, _ := net.SplitHostPort(a.addr)
		_, nodePort, _ := net.SplitHostPort(lis.Addr().String())
		hostAddr := nodeAddress(t)
		cmd := fmt.Sprintf(`
c() { if timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "$1: connected"; else echo "$1: failed"; fi; }
c agent 127.0.0.1 %s; c node 127.0.0.1 %s; c nodeaddr %s %s; echo "resolver: $(grep -c '^nameserver 192.0.2.53$' /etc/resolv.conf)"`, agentPort, nodePort, hostAddr, nodePort)
		seq++
		egress := a.run(fmt.Sprintf("a-%d", seq), cmd, "Egress")
		expectEach(t, stdoutOf(egress), map[string]string{"agent": "failed", "node": "failed", "nodeaddr": "failed", "resolver": "1"})
		if got := egress.GetIsolation(); got.GetNetwork() != "Egress" || !strings.Contains(strings.Join(got.GetNamespaces(), ","), "net") {
			t.Errorf("isolation of the Egress task: %v", got)
		}
		seq++
		node := a.run(fmt.Sprintf("a-%d", seq), cmd, "Node")
		expectEach(t, stdoutOf(node), map[string]string{"agent": "connected", "node": "connected", "nodeaddr": "connected"})
	})

	t.Run("A runs a fork bomb; B finishes in its usual time", func(t *testing.T) {
		probe := `for i in $(seq 50); do /bin/true; done; echo done`
		timed := func(uid string) (time.Duration, *agentv1.TaskStatus) {
			begin := time.Now()
			st := a.run(uid, probe, "")
			return time.Since(begin), st
		}
		usual, _ := timed("b2-before")
		// The bomb, then a loop that needs to fork: A can no longer start
		// anything and ends by its timeout.
		spec := taskSpec("a-bomb", `:(){ :|:& };:; while :; do /bin/true; done`)
		spec.Timeout = durationpb.New(6 * time.Second)
		if _, err := a.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
			t.Fatal(err)
		}
		// The bomb is at its limit once bash reports a refused fork
		// ("fork: retry: Resource temporarily unavailable"), under
		// pids.max and RLIMIT_NPROC alike.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(a.get("a-bomb").GetStderr().GetTail(), "fork: ") {
			if time.Now().After(deadline) {
				t.Fatalf("no refused fork in the bomb's stderr within 30 s: %v", a.get("a-bomb"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		// That B is not slowed down is a figure, logged below; a wall-clock
		// bound here would fail on a busy machine rather than on a bomb
		// that holds B back, which the limit prevents: B must still run.
		during, st := timed("b2-during")
		if st.GetReason() != "Succeeded" || stdoutOf(st) != "done\n" {
			t.Errorf("B during the bomb: %s %q in %v (usually %v)", st.GetReason(), stdoutOf(st), during, usual)
		}
		bomb := a.finish("a-bomb")
		t.Logf("B took %v during the bomb, %v before; the bomb: %s, %s", during, usual, bomb.GetReason(), bomb.GetIsolation())
		if bomb.GetReason() != "TimedOut" || bomb.GetIsolation().GetPidsLimit() == "" {
			t.Errorf("the bomb ended %s (%s), isolation %v", bomb.GetReason(), bomb.GetMessage(), bomb.GetIsolation())
		}
	})

	t.Run("A fills /tmp", func(t *testing.T) {
		out := stdoutOf(attack(`head -c 20M /dev/zero > /tmp/fill 2>err; echo "rc: $?"; echo "err: $(sed 's/.*: //' err)"; echo "size: $(stat -c %s /tmp/fill)"`))
		expectEach(t, out, map[string]string{"rc": "1", "err": "No space left on device", "size": strconv.Itoa(attackTmpSize)})
	})

	t.Run("A runs su and a setuid-root binary", func(t *testing.T) {
		out := stdoutOf(attack(`echo "setuid: $(` + a.setuidBin + ` -u)"; echo "own: $(id -u)"; echo "su: $(/usr/bin/su -c 'id -u' root </dev/null 2>&1 | sed 's/.*: //')"`))
		if !strings.Contains(out, "setuid: 22000") || strings.Contains(out, "setuid: 0") || strings.Contains(out, "su: 0") {
			t.Errorf("privilege gained:\n%s", out)
		}
	})
}

// A's UID is reused only after A's processes and files are gone: a task
// that leaves a setsid sleep behind does not hand it to the next tenant.
func TestAttackUIDReuseAfterSetsidEscapee(t *testing.T) {
	a := newAttackRig(t, 2300000, 2300000) // one UID: the next task must get A's
	// A's shell stays until the test has tried the second start: a shell
	// that ended at once could be finished (and its UID free again) before
	// that start arrives on a busy machine.
	a.start("a", `setsid sleep 300 & echo started; until [ -e release ]; do sleep 0.05; done`, "")
	if _, err := a.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("early", "true")}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second task while A holds the only UID: %v, want ResourceExhausted", err)
	}
	a.srv.mu.Lock()
	workDir := a.srv.tasks["a"].rec.Process.WorkDir
	a.srv.mu.Unlock()
	if err := os.WriteFile(filepath.Join(workDir, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st := a.finish("a")
	if st.GetReason() != "Succeeded" || st.GetLeftoverProcesses() != 1 {
		t.Errorf("A: %s, %d leftovers (%s)", st.GetReason(), st.GetLeftoverProcesses(), st.GetMessage())
	}
	// Nothing of UID 2300000 is left on the node once A is finished.
	for _, pid := range procPIDs(t) {
		if uid, ok := procUID(pid); ok && uid == 2300000 {
			t.Errorf("process %d of A's UID alive after A finished", pid)
		}
	}
	a.srv.mu.Lock()
	rec := a.srv.tasks["a"].rec.Process
	a.srv.mu.Unlock()
	if !rec.LeaseReleased || rec.WorkDir == "" {
		t.Errorf("A's record %+v: want its lease released", rec)
	} else if _, err := os.Stat(rec.WorkDir); !os.IsNotExist(err) {
		t.Errorf("A's working directory %s: %v, want it removed", rec.WorkDir, err)
	}
	c := a.run("c", `id -u; ps -eo uid= | sort -u | tr -d ' '`, "")
	if got := stdoutOf(c); got != "2300000\n2300000\n" {
		t.Errorf("the next tenant on A's UID sees %q, want only itself", got)
	}
}

func procPIDs(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func procUID(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			uid, err := strconv.Atoi(f[0])
			return uid, err == nil
		}
	}
	return 0, false
}
