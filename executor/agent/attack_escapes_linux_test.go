//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// The escape classes of public reports (ESCAPES.md E1-E18; E7, the
// network, and E15's disk are elsewhere), each as a row that fails when
// its layer is taken away. Each row has a positive control, so that it
// cannot pass because the probe itself is broken: the same probe run by a
// plain process of the agent, or against the task's own objects,
// succeeds. A layer the machine lacks is a t.Skip naming it.

// hostProbe runs script with bash as a plain child process of the agent
// (root, the node's namespaces, no filter), or as uid when uid is not 0:
// the process level's view, the control of a row.
func hostProbe(t *testing.T, uid uint32, script string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "/bin/bash", "-c", script)
	cmd.Dir = "/"
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // the labels carry the results
	return out.String()
}

// labels parses "label: value" lines.
func labels(out string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			m[k] = v
		}
	}
	return m
}

// syscallProbe tries the calls of ESCAPES E5 and E8-E13 through ctypes
// and prints "label: result" for each, result being "succeeded" or the
// error's text. x86-64 numbers.
const syscallProbe = `/usr/bin/python3 -c '
import ctypes, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def r(label, rc):
    print("%s: %s" % (label, os.strerror(ctypes.get_errno()) if rc < 0 else "succeeded"), flush=True)
buf = ctypes.create_string_buffer(256)
# E8: a ring of 4 entries.
r("io_uring_setup", libc.syscall(425, 4, buf))
# E9: namespaces through unshare and clone3, and the x32 ABI (getpid | bit 30).
r("unshare-user", libc.unshare(0x10000000))
r("unshare-time", libc.unshare(0x80))
r("unshare-mount", libc.unshare(0x20000))
args = ctypes.create_string_buffer(88)
struct.pack_into("<QQQQQ", args, 0, 0x10000000, 0, 0, 0, 17)
r("clone3-user", libc.syscall(435, args, 88))
r("x32-getpid", libc.syscall(0x40000000 | 39))
# E10: personality flags that weaken the layout, modify_ldt.
r("personality-no-aslr", libc.personality(0x0040000))
r("personality-read-implies-exec", libc.personality(0x0400000))
r("modify_ldt", libc.syscall(154, 0, buf, 16))
# E11: userfaultfd (user-mode only), perf_event_open (a software clock
# on this process), bpf (an array map).
r("userfaultfd", libc.syscall(323, 1))
attr = ctypes.create_string_buffer(128)
struct.pack_into("<IIQ", attr, 0, 1, 128, 0)
r("perf_event_open", libc.syscall(298, attr, 0, -1, -1, 0))
battr = ctypes.create_string_buffer(128)
struct.pack_into("<IIII", battr, 0, 2, 4, 4, 1)
r("bpf", libc.syscall(321, 0, battr, 128))
# E12: keyrings.
r("keyctl", libc.syscall(250, 0, -3, 0))
r("add_key", libc.syscall(248, b"user", b"bashtask-probe", b"x", 1, -2))
r("request_key", libc.syscall(249, b"user", b"bashtask-probe-absent", None, 0))
# E13: the kernel log buffer size.
r("syslog", libc.syscall(103, 10, None, 0))
# E5: another process through a pidfd, its memory.
pfd = libc.syscall(434, os.getpid(), 0)
r("pidfd_getfd", libc.syscall(438, pfd, 0, 0) if pfd >= 0 else pfd)
iov = struct.pack("<QQ", ctypes.addressof(buf), 8)
liov = ctypes.create_string_buffer(iov)
r("process_vm_readv", libc.syscall(310, os.getpid(), liov, 1, liov, 1, 0))
r("ptrace-traceme", libc.syscall(101, 0, 0, 0, 0))
# Socket families of the reference: AF_ALG, AF_VSOCK.
for label, fam in (("socket-alg", 38), ("socket-vsock", 40)):
    r(label, libc.socket(fam, socket.SOCK_SEQPACKET if fam == 38 else socket.SOCK_STREAM, 0))
r("socket-unix", libc.socket(1, 1, 0))
'`

func TestAttackEscapeClasses(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the probes need /usr/bin/python3")
	}
	a := newAttackRig(t, 2400000, 2400003)
	seq := 0
	attack := func(command, network string, env ...*agentv1.EnvVar) *agentv1.TaskStatus {
		t.Helper()
		seq++
		uid := fmt.Sprintf("e-%d", seq)
		a.start(uid, command, network, env...)
		st := a.finish(uid)
		if st.GetIsolation().GetLevel() != "tenant" {
			t.Fatalf("ran at level %q", st.GetIsolation().GetLevel())
		}
		return st
	}
	// workDirOf returns a running task's working directory.
	workDirOf := func(uid string) string {
		a.srv.mu.Lock()
		defer a.srv.mu.Unlock()
		return a.srv.tasks[uid].rec.Process.WorkDir
	}

	t.Run("E5 E8-E13 system calls the filter refuses", func(t *testing.T) {
		if runtime.GOARCH != "amd64" {
			t.Skip("the probe's system-call numbers are x86-64's; executor/shim's tests check the filter on every architecture")
		}
		task := labels(stdoutOf(attack(syscallProbe, "")))
		host := labels(hostProbe(t, 0, syscallProbe))
		const eperm, enosys = "Operation not permitted", "Function not implemented"
		want := map[string]string{
			"io_uring_setup": eperm, "unshare-user": eperm, "unshare-time": eperm, "unshare-mount": eperm,
			"clone3-user": enosys, "x32-getpid": enosys,
			"personality-no-aslr": eperm, "personality-read-implies-exec": eperm, "modify_ldt": eperm,
			"userfaultfd": eperm, "perf_event_open": eperm, "bpf": eperm,
			"keyctl": eperm, "add_key": eperm, "request_key": eperm, "syslog": eperm,
			"pidfd_getfd": eperm, "process_vm_readv": eperm, "ptrace-traceme": eperm,
			"socket-alg": eperm, "socket-vsock": eperm,
		}
		// What the agent's own process gets where the kernel lacks the
		// call or the feature: the row cannot tell the filter from the
		// kernel there.
		missing := map[string]string{
			"io_uring_setup": "io_uring (not built, or kernel.io_uring_disabled)",
			"x32-getpid":     "the x32 ABI (CONFIG_X86_X32_ABI)",
			"socket-vsock":   "AF_VSOCK (vsock module not loaded)",
			"socket-alg":     "AF_ALG",
		}
		for label, w := range want {
			t.Run(label, func(t *testing.T) {
				if task[label] != w {
					t.Errorf("task: %q, want %q", task[label], w)
				}
				if host[label] == task[label] {
					m := missing[label]
					if m == "" {
						m = "this call for root (a kernel option or policy of the machine)"
					}
					t.Skipf("this kernel refuses the agent's own process %s too (%q): the probe cannot tell the filter from the kernel here; executor/shim's TestSeccompAtLeastAsStrictAsReference shows the filter refuses it", m, host[label])
				}
			})
		}
		if task["socket-unix"] != "succeeded" {
			t.Errorf("control: a Unix socket in the task: %q", task["socket-unix"])
		}
	})

	t.Run("E1 every mount but the task's own is read-only, and every one nosuid", func(t *testing.T) {
		st := attack(`
awk '{print $5, $6}' /proc/self/mountinfo > "$PWD/.mounts"
while read -r mp opts; do
  case ,$opts, in *,rw,*) echo "rw: $mp";; esac
  case ,$opts, in *,nosuid,*) ;; *) echo "suid: $mp";; esac
  [ -d "$mp" ] || continue
  if (: > "$mp/.bashtask-probe") 2>/dev/null; then echo "written: $mp"; rm -f "$mp/.bashtask-probe"; fi
done < "$PWD/.mounts"
echo "mounts: $(wc -l < "$PWD/.mounts")"
echo "submounts: $(awk '$1 ~ "^/(dev|sys|run)/" {n++} END {print n+0}' "$PWD/.mounts")"`, "")
		out := stdoutOf(st)
		wd := workDirOfFinished(a, fmt.Sprintf("e-%d", seq))
		// /home is the task's private tmpfs holding its HOME (the shim's
		// user step), no node path reaches it.
		allowedRW := []string{wd, "/tmp", "/dev/shm", "/proc", "/dev/mqueue", "/home"}
		for line := range strings.SplitSeq(out, "\n") {
			kind, mp, _ := strings.Cut(line, ": ")
			switch kind {
			case "rw", "written":
				if !slices.Contains(allowedRW, mp) {
					t.Errorf("%s mount %s", kind, mp)
				}
			case "suid":
				t.Errorf("mount %s without nosuid", mp)
			}
		}
		// Controls: the loop saw and wrote the task's own writable
		// mounts, and the node's submounts are in the list.
		for _, w := range []string{"written: " + wd, "written: /tmp", "rw: /tmp"} {
			if !strings.Contains(out, w+"\n") {
				t.Errorf("control: no %q in\n%s", w, out)
			}
		}
		if l := labels(out); l["submounts"] == "0" || l["submounts"] == "" {
			t.Errorf("control: no submount of /dev, /sys or /run in the task's mounts:\n%s", out)
		}
	})

	t.Run("E2 a mount made on the node after the task started does not appear in it", func(t *testing.T) {
		dir := filepath.Join(a.base, "prop")
		sub := filepath.Join(dir, "sub")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		// A shared mount, as / is on a systemd node, so that the
		// namespaces copied from it would receive later mounts.
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
		if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
			t.Fatal(err)
		}
		// Control: a mount namespace made the plain way, before the mount.
		ctl := exec.CommandContext(t.Context(), "unshare", "-m", "--propagation", "unchanged", "sh", "-c",
			`echo ready; read x; grep -c " `+sub+` " /proc/self/mountinfo`)
		ctlIn, _ := ctl.StdinPipe()
		ctlOut, _ := ctl.StdoutPipe()
		if err := ctl.Start(); err != nil {
			t.Fatal(err)
		}
		ctlLines := bufio.NewReader(ctlOut)
		if line, err := ctlLines.ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("control namespace: %q %v", line, err)
		}
		seq++
		uid := fmt.Sprintf("e-%d", seq)
		a.start(uid, `echo waiting; while [ ! -e go ]; do sleep 0.05; done; echo "seen: $(grep -c " `+sub+` " /proc/self/mountinfo)"`, "")
		a.waitOutput(uid, "waiting")
		if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=4k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
		if err := os.WriteFile(filepath.Join(workDirOf(uid), "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ctlIn.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
		ctlSeen, _ := ctlLines.ReadString('\n')
		_ = ctl.Wait()
		out := stdoutOf(a.finish(uid))
		if !strings.Contains(out, "seen: 0\n") {
			t.Errorf("the task sees the node's later mount:\n%s", out)
		}
		if ctlSeen != "1\n" {
			t.Errorf("control: a mount namespace of the node's propagation did not get the mount: %q", ctlSeen)
		}
	})

	t.Run("E3 the node's SysV and POSIX IPC objects are out of reach and a task's die with it", func(t *testing.T) {
		key := 0x6261_0000 | os.Getpid()&0xffff
		id, err := unix.SysvShmGet(key, 4096, unix.IPC_CREAT|0o666)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil) })
		mq := fmt.Sprintf("bashtask-attack-%d", os.Getpid())
		name, _ := unix.BytePtrFromString(mq)
		fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o666, 0, 0, 0)
		if e != 0 {
			t.Fatalf("mq_open: %v", e)
		}
		unix.Close(int(fd))
		t.Cleanup(func() { _, _, _ = unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0) })
		probe := fmt.Sprintf(`/usr/bin/python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def r(label, rc):
    print("%%s: %%s" %% (label, os.strerror(ctypes.get_errno()) if rc < 0 else "succeeded"), flush=True)
r("node-shm", libc.shmget(%d, 0, 0))
r("node-mqueue", libc.mq_open(b"/%s", os.O_RDONLY))
'
echo "mqueue-dir: $(ls /dev/mqueue 2>/dev/null | grep -c %s)"`, key, mq, mq)
		task := labels(stdoutOf(attack(probe+`
/usr/bin/python3 -c '
import ctypes; libc = ctypes.CDLL(None)
print("own-shm: %d" % (libc.shmget(0, 4096, 0o1600) >= 0))'
echo "own-listed: $(ipcs -m | grep -c '^0x')"`, "")))
		host := labels(hostProbe(t, 65534, probe))
		for _, l := range []string{"node-shm", "node-mqueue"} {
			if task[l] != "No such file or directory" {
				t.Errorf("%s in the task: %q", l, task[l])
			}
			if host[l] != "succeeded" {
				t.Errorf("control: %s from a plain process of another UID: %q", l, host[l])
			}
		}
		if task["mqueue-dir"] != "0" {
			t.Errorf("the task's /dev/mqueue lists the node's queue")
		}
		if task["own-shm"] != "1" || task["own-listed"] != "1" {
			t.Errorf("control: the task's own segment: made %q, listed %q", task["own-shm"], task["own-listed"])
		}
		next := labels(stdoutOf(attack(`echo "left: $(ipcs -m | grep -c '^0x')"`, "")))
		if next["left"] != "0" {
			t.Errorf("a segment of an earlier task is visible to the next: %q", next["left"])
		}
	})

	t.Run("E4 no descriptor, directory or environment of the agent reaches the task", func(t *testing.T) {
		const envName, envValue = "BASHTASK_ATTACK_AGENT_ONLY", "agent-env-5d2e"
		t.Setenv(envName, envValue)
		// An inheritable descriptor of the agent's: the TLS key.
		fd, err := unix.Open(a.tlsKey, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC != 0 {
			t.Fatalf("control: the agent's descriptor %d is not inheritable (%d, %v)", fd, flags, err)
		}
		// The pool's shims started before the descriptor was opened lack
		// it: tasks until one's shim holds it (the control), at most the
		// pool's size and one more.
		var out map[string]string
		reached := false
		for i := 0; i < 4 && !reached; i++ {
			seq++
			uid := fmt.Sprintf("e-%d", seq)
			a.start(uid, `echo waiting; while [ ! -e go ]; do sleep 0.05; done
ls /proc/$$/fd > .fds; echo "fds: $(tr '\n' ' ' < .fds)"
echo "env: $(env | grep -c `+envName+`)"
echo "cwd: $(readlink /proc/$$/cwd)"
echo "shim-cwd: $(ls /proc/1/cwd/ 2>&1 | sed 's/.*: //')"`, "")
			a.waitOutput(uid, "waiting")
			a.srv.mu.Lock()
			shimPID := a.srv.tasks[uid].rec.Process.PID
			a.srv.mu.Unlock()
			ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", shimPID))
			for _, e := range ents {
				if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", shimPID, e.Name())); l == a.tlsKey {
					reached = true
				}
			}
			wd := workDirOf(uid)
			if err := os.WriteFile(filepath.Join(wd, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			out = labels(stdoutOf(a.finish(uid)))
			if out["fds"] != "0 1 2 " || out["env"] != "0" || out["shim-cwd"] != "No such file or directory" || out["cwd"] != wd {
				t.Errorf("the task got something of the agent's: %v (working directory %s)", out, wd)
			}
		}
		if !reached {
			t.Errorf("control: no task's shim held the agent's inheritable descriptor %d: the row shows nothing", fd)
		}
		if !strings.Contains(strings.Join(os.Environ(), "\n"), envName+"="+envValue) {
			t.Errorf("control: the agent's environment lacks %s", envName)
		}
	})

	t.Run("E5 the shim's descriptors, environment and memory are out of reach", func(t *testing.T) {
		st := attack(`
r() { echo "$1: $( { eval "$2" >/dev/null; } 2>&1 | sed 's/.*: //')"; }
r shim-environ 'cat /proc/1/environ'
r shim-mem 'head -c1 /proc/1/mem'
r shim-fd 'ls /proc/1/fd'
r shim-maps 'cat /proc/1/maps'
r own-environ 'cat /proc/self/environ'
r own-maps 'cat /proc/self/maps'`, "")
		expect := map[string]string{"shim-environ": "No such file or directory", "shim-mem": "No such file or directory",
			"shim-fd": "No such file or directory", "shim-maps": "No such file or directory",
			"own-environ": "", "own-maps": ""} // the controls: its own process's files read
		out := labels(stdoutOf(st))
		for k, w := range expect {
			if out[k] != w {
				t.Errorf("%s: %q, want %q", k, out[k], w)
			}
		}
	})

	t.Run("E6 abstract Unix sockets of the node's network namespace are out of reach", func(t *testing.T) {
		name := fmt.Sprintf("bashtask-attack-%d", os.Getpid())
		lis, err := net.Listen("unix", "@"+name)
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
		probe := fmt.Sprintf(`/usr/bin/python3 -c '
import os, socket
def c(label, addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(addr); print(label + ": connected")
    except OSError as e:
        print(label + ": " + os.strerror(e.errno))
own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
own.bind("\0bashtask-own-%%d" %% os.getpid()); own.listen(1)
c("node", "\0%s")
c("own", own.getsockname())
'`, name)
		host := labels(hostProbe(t, 65534, probe))
		if host["node"] != "connected" {
			t.Fatalf("control: a plain process does not reach the node's abstract socket: %v", host)
		}
		none := labels(stdoutOf(attack(probe, "None")))
		if none["node"] != "Connection refused" || none["own"] != "connected" {
			t.Errorf("network None: %v, want the node's refused and its own connected", none)
		}
		if abi := shim.LandlockABI(); abi < 6 {
			testutil.SkipUnlessStrictf(t, "Landlock ABI %d < 6: abstract Unix sockets are not scoped, a task with network Node reaches the node's and other Node tasks' (use network None)", abi)
		}
		node := labels(stdoutOf(attack(probe, "Node")))
		if node["node"] != "Operation not permitted" || node["own"] != "connected" {
			t.Errorf("network Node: %v, want the node's refused by Landlock's scope and its own connected", node)
		}
	})

	t.Run("E13 E14 the kernel log and the node-wide files of /proc are hidden", func(t *testing.T) {
		probe := `
for f in /dev/kmsg /proc/timer_list /proc/keys /proc/kcore /proc/sched_debug; do
  [ -e "$f" ] || { echo "$f: absent"; continue; }
  echo "$f: $(dd if="$f" bs=8192 count=1 iflag=nonblock 2>/dev/null | wc -c)"
done
echo "dmesg: $(dmesg 2>/dev/null | wc -l)"
echo "mnt-namespaces: $(readlink /proc/[0-9]*/ns/mnt 2>/dev/null | sort -u | wc -l)"`
		task := labels(stdoutOf(attack(probe, "")))
		host := labels(hostProbe(t, 0, probe))
		for _, f := range []string{"/dev/kmsg", "/proc/timer_list", "/proc/keys", "/proc/kcore", "/proc/sched_debug"} {
			if host[f] == "absent" {
				continue // not in this kernel
			}
			if task[f] != "0" && task[f] != "absent" {
				t.Errorf("%s: the task read %s bytes", f, task[f])
			}
			if host[f] == "0" {
				t.Logf("control: %s is empty for the agent too", f)
			}
		}
		if host["/dev/kmsg"] == "0" || host["/proc/timer_list"] == "0" {
			t.Errorf("control: the agent reads nothing of /dev/kmsg (%s) or /proc/timer_list (%s)", host["/dev/kmsg"], host["/proc/timer_list"])
		}
		if task["dmesg"] != "0" || host["dmesg"] == "0" {
			t.Errorf("dmesg: %s lines in the task, %s for the agent", task["dmesg"], host["dmesg"])
		}
		if task["mnt-namespaces"] != "1" || host["mnt-namespaces"] == "1" {
			t.Errorf("mount namespaces in /proc: %s in the task (want its own), %s on the node", task["mnt-namespaces"], host["mnt-namespaces"])
		}
	})

	t.Run("E14 the node's network interfaces, other tasks' veths among them, are not listed in /sys", func(t *testing.T) {
		probe := `echo "class: $(ls /sys/class/net 2>/dev/null | wc -l)"; echo "virtual: $(ls /sys/devices/virtual/net 2>/dev/null | wc -l)"`
		host := labels(hostProbe(t, 0, probe))
		if host["class"] == "0" || host["virtual"] == "0" {
			t.Fatalf("control: the node lists no interface in /sys: %v", host)
		}
		for _, network := range []string{"None"} {
			if task := labels(stdoutOf(attack(probe, network))); task["class"] != "0" || task["virtual"] != "0" {
				t.Errorf("network %s: the task lists %s interfaces in /sys/class/net and %s in /sys/devices/virtual/net, want none", network, task["class"], task["virtual"])
			}
		}
	})

	t.Run("E14 other tasks' cgroups", func(t *testing.T) {
		t.Skip("no cgroup namespace: a task lists other tasks' cgroups under /sys/fs/cgroup and reads their counters (docs/security.md, does not defend)")
	})

	t.Run("E15 /dev/shm is capped like /tmp", func(t *testing.T) {
		out := labels(stdoutOf(attack(`head -c 20M /dev/zero > /dev/shm/fill 2>err; echo "rc: $?"; echo "err: $(sed 's/.*: //' err)"; echo "size: $(stat -c %s /dev/shm/fill)"`, "")))
		if out["rc"] != "1" || out["err"] != "No space left on device" || out["size"] != strconv.Itoa(attackTmpSize) {
			t.Errorf("filling /dev/shm: %v, want ENOSPC at %d bytes", out, attackTmpSize)
		}
	})

	t.Run("E15 a tmpfs holds a bounded number of files and SysV memory the size of /dev/shm", func(t *testing.T) {
		// Empty files cost kernel memory that no size cap counts, and
		// SysV segments live outside /dev/shm: both are bounded like
		// the bytes. Controls: files up to the inode limit and a small
		// segment are made.
		out := labels(stdoutOf(attack(fmt.Sprintf(`n=0; while [ $n -lt %d ]; do : 2>/tmp/err > /tmp/f$n || break; n=$((n+1)); done
echo "files: $n"; echo "err: $(sed 's/.*: //' /tmp/err)"; rm -f /tmp/f*
echo "small: $(ipcmk -M 4096 >/dev/null 2>&1 && echo made || echo refused)"
echo "big: $(ipcmk -M %d >/dev/null 2>&1 && echo made || echo refused)"`, 2*attackTmpSize/2048, 2*attackTmpSize), "")))
		files, _ := strconv.Atoi(out["files"])
		if files < 1000 || files >= 2*attackTmpSize/2048 || out["err"] != "No space left on device" {
			t.Errorf("empty files in /tmp: %v, want ENOSPC after about %d files", out, attackTmpSize/2048)
		}
		if out["small"] != "made" || out["big"] != "refused" {
			t.Errorf("SysV shared memory: %v, want a 4 KiB segment made and one of %d bytes refused", out, 2*attackTmpSize)
		}
	})

	t.Run("E15 memory", func(t *testing.T) {
		spec := taskSpec("e-mem", `/usr/bin/python3 -c 'b = b"x" * (256 << 20); print("allocated")'`)
		spec.Resources = &agentv1.Resources{MemoryBytes: 64 << 20}
		if _, err := a.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
			t.Fatal(err)
		}
		st := a.finish("e-mem")
		if slices.Contains(st.GetLimitsNotEnforced(), "memory") {
			t.Skipf("no memory controller for task cgroups on this node (%s): a task's memory is not limited", st.GetMessage())
		}
		if strings.Contains(stdoutOf(st), "allocated") || st.GetReason() == "Succeeded" {
			t.Errorf("256 MiB allocated under a 64 MiB limit: %s %q (%s, limits not enforced %v)", st.GetReason(), stdoutOf(st), st.GetMessage(), st.GetLimitsNotEnforced())
		}
	})

	t.Run("E16 a node's 0666 Unix socket under /run and a world-readable device node outside /dev are out of reach", func(t *testing.T) {
		sock := fmt.Sprintf("/run/bashtask-attack-%d.sock", os.Getpid())
		for _, path := range []string{sock, a.listedSock} {
			testutil.ListenNodeSocket(t, path)
		}
		device := filepath.Join(a.base, "loop")
		testutil.MknodWorldReadableBlock(t, device)
		probe := fmt.Sprintf(`/usr/bin/python3 -c '
import os, socket
for label, path in (("node", %q), ("listed", %q)):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path); print(label + ": connected")
    except OSError as e:
        print(label + ": " + os.strerror(e.errno))
try:
    os.close(os.open(%q, os.O_RDONLY)); print("device: opened")
except OSError as e:
    print("device: " + os.strerror(e.errno))
'`, sock, a.listedSock, device)
		host := labels(hostProbe(t, 65534, probe))
		if host["node"] != "connected" || host["listed"] != "connected" || host["device"] != "opened" {
			testutil.SkipUnlessStrictf(t, "control: a plain process of UID 65534 does not reach the node's socket and device here (%v)", host)
			return
		}
		for _, network := range []string{"Node", "None"} {
			task := labels(stdoutOf(attack(probe, network)))
			if task["node"] != "No such file or directory" || task["listed"] != "connected" || task["device"] != "Permission denied" {
				t.Errorf("network %s: %v, want the node's socket absent (a /run of its own), the listed one connected and the device refused (nodev)", network, task)
			}
		}
	})

	t.Run("E17 no groups, no capabilities in any set", func(t *testing.T) {
		probe := `grep -E '^(Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status | tr -s '\t ' ' '`
		task := labels(stdoutOf(attack(probe, "")))
		host := labels(hostProbe(t, 0, probe))
		want := map[string]string{"Groups:": "", "CapInh:": "0000000000000000", "CapPrm:": "0000000000000000",
			"CapEff:": "0000000000000000", "CapBnd:": "0000000000000000", "CapAmb:": "0000000000000000"}
		for k, w := range want {
			k = strings.TrimSuffix(k, ":")
			if strings.TrimSpace(task[k]) != w {
				t.Errorf("%s: %q, want %q", k, task[k], w)
			}
		}
		if host["CapEff"] == "0000000000000000" || host["CapBnd"] == "0000000000000000" {
			t.Errorf("control: the agent's own process has no capabilities: %v", host)
		}
	})

	t.Run("E18 the status names the Landlock ABI applied", func(t *testing.T) {
		st := attack(`true`, "")
		abi := shim.LandlockABI()
		if abi == 0 {
			testutil.SkipUnlessStrict(t, "no Landlock in this kernel: the mounts alone keep the file system read-only")
		}
		if got := st.GetIsolation().GetLandlockAbi(); int(got) != min(abi, 6) {
			t.Errorf("status says Landlock ABI %d, the kernel offers %d (the shim applies up to 6)", got, abi)
		}
	})
}

// workDirOfFinished returns a task's working directory from its record.
func workDirOfFinished(a *attackRig, uid string) string {
	a.srv.mu.Lock()
	defer a.srv.mu.Unlock()
	if tk := a.srv.tasks[uid]; tk != nil {
		return tk.rec.Process.WorkDir
	}
	return ""
}

// Across workspaces (ESCAPES.md E6, E7 and the tenant rules between
// owners): a task of workspace W2 cannot read W1's files (through the
// node path of W1's root, which W2's mount namespace does not hold, nor
// through /proc), nor W1's carried variables (in the masked state
// directory), nor reach W1's loopback. Controls: W1's own task reads and
// reaches all of it, and the agent's own process finds W1's files at
// the paths the attack tries.
func TestAttackAcrossWorkspaces(t *testing.T) {
	a := newAttackRig(t, 2400010, 2400013)
	wc := a.workspaceClient()
	ensure(t, wc, "aw1", "None", true)
	ensure(t, wc, "aw2", "None", true)
	t.Cleanup(func() {
		for _, uid := range []string{"aw1", "aw2"} {
			_, _ = wc.DeleteWorkspace(context.Background(), &agentv1.DeleteWorkspaceRequest{Uid: uid})
		}
	})
	const secret = "w1-secret-5c1d"
	a.runTask(wsTask("aw1-a", "aw1", `echo `+secret+` > secret; export W1_VALUE=`+secret))
	if _, err := a.client.Start(t.Context(), &agentv1.StartRequest{Spec: wsTask("aw1-srv", "aw1",
		`perl -MIO::Socket::INET -e '$|=1; $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:7412", Listen => 5, ReuseAddr => 1) or die; print "listening\n"; while ($c = $s->accept) { print $c "`+secret+`\n"; close $c }' & wait`)}); err != nil {
		t.Fatal(err)
	}
	a.waitOutput("aw1-srv", "listening")
	defer func() { _, _ = a.client.Cancel(context.Background(), &agentv1.CancelRequest{Uid: "aw1-srv"}) }()

	w1Root := filepath.Join(a.base, "work", "workspaces", "aw1")
	envFile := filepath.Join(a.base, "state", "workspaces", "aw1", workspaceEnvFile)
	probe := fmt.Sprintf(`echo "file: $(cat %s/secret 2>&1)"
echo "env-file: $(cat %s 2>&1 | tr '\0' ' ')"
echo "home: $(cat /home/task/secret 2>&1)"
echo "env: ${W1_VALUE-unset}"
echo "loopback: $( (exec 3<>/dev/tcp/127.0.0.1/7412 && cat <&3) 2>&1)"
echo "proc: $(cat /proc/*/root%s/secret 2>&1 | head -1)"`, w1Root, envFile, w1Root)

	if host := labels(hostProbe(t, 0, probe)); host["file"] != secret || !strings.Contains(host["env-file"], "W1_VALUE="+secret) {
		t.Fatalf("control: the agent's own process does not find W1's files: %v", host)
	}
	own := labels(stdoutOf(a.runTask(wsTask("aw1-b", "aw1", probe))))
	if own["home"] != secret || own["env"] != secret || own["loopback"] != secret {
		t.Errorf("control: W1's own task: %v", own)
	}
	other := labels(stdoutOf(a.runTask(wsTask("aw2-a", "aw2", probe))))
	t.Logf("W2's task: %v", other)
	for _, label := range []string{"file", "env-file", "home", "env", "loopback", "proc"} {
		if strings.Contains(other[label], secret) {
			t.Errorf("W2's task reached W1's %s: %q", label, other[label])
		}
	}
	if other["env"] != "unset" {
		t.Errorf("W2's task has W1's carried variable: %q", other["env"])
	}
}
