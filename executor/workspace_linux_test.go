//go:build linux

package executor

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// workspaceUIDs hands out the UIDs of the test workspaces, a block of
// their own.
var workspaceUIDs = func() *atomic.Uint32 {
	var n atomic.Uint32
	n.Store(2101000)
	return &n
}()

// tenantExecutor is a tenant-level executor; mutate adjusts its Config.
func tenantExecutor(t *testing.T, mutate ...func(*Config)) *Executor {
	t.Helper()
	return newTestExecutor(t, CgroupAuto, append([]func(*Config){func(c *Config) { c.Isolation = IsolationTenant }}, mutate...)...)
}

// testWorkspace opens a workspace of network on ex under a fresh
// directory, with an image in another when image is set; Remove runs at
// cleanup.
func testWorkspace(t *testing.T, ex *Executor, network Network, image bool) *Workspace {
	t.Helper()
	uid := workspaceUIDs.Add(1)
	o := WorkspaceOptions{ID: "ws-" + strconv.Itoa(int(uid)), UID: uid, GID: uid, Network: network}
	if image {
		o.Image = filepath.Join(t.TempDir(), "disk.img")
	}
	w, err := ex.OpenWorkspace(o)
	if err != nil {
		t.Fatalf("OpenWorkspace: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	return w
}

// wsSpec is a spec of a task in w starting in dir, carrying its
// directory (and its environment with env), with env as carried
// variables.
func wsSpec(t *testing.T, w *Workspace, command, dir string, carryEnv bool, env ...EnvVar) Spec {
	spec := Spec{Command: command, SpillDir: filepath.Join(t.TempDir(), "spill"), KillGrace: time.Second}
	spec.Workspace = &WorkspaceTask{Workspace: w, Dir: dir, Carry: true, CarryEnv: carryEnv, Env: env}
	return spec
}

// A task of a workspace runs as its UID with HOME at the workspace's
// root, which it shares with the next task; the directory a shell ends
// in is recorded, also after exit, a failure and a timeout, and a shell
// that cannot record it says why.
func TestWorkspaceFilesAndCarriedDir(t *testing.T) {
	t.Parallel()
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNone, false)

	res := run(t, ex, wsSpec(t, w, `echo hi > a.txt; mkdir -p sub/deeper; id -u; echo "$HOME"; pwd; cd sub`, "", false))
	if res.Reason != ReasonSucceeded {
		t.Fatalf("first task: %s %q %q", res.Reason, res.Message, res.Stderr.Tail)
	}
	want := []string{strconv.Itoa(int(w.UID())), WorkspaceHome, WorkspaceHome}
	if got := strings.Fields(res.Stdout.Tail); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("uid, HOME, pwd = %q, want %q", got, want)
	}
	if res.StartDir != WorkspaceHome {
		t.Errorf("StartDir %q, want %q", res.StartDir, WorkspaceHome)
	}
	if c := res.Carry; c == nil || !c.Recorded || c.Dir != WorkspaceHome+"/sub" {
		t.Errorf("carry %+v, want %s/sub recorded", c, WorkspaceHome)
	}
	if b, err := os.ReadFile(filepath.Join(w.Dir(), "a.txt")); err != nil || string(b) != "hi\n" {
		t.Errorf("a.txt on the node: %q, %v", b, err)
	}

	res = run(t, ex, wsSpec(t, w, `pwd; cat ../a.txt`, "sub", false))
	if res.Stdout.Tail != WorkspaceHome+"/sub\nhi\n" || res.StartDir != WorkspaceHome+"/sub" {
		t.Errorf("second task in sub: stdout %q, start %q, %s", res.Stdout.Tail, res.StartDir, res.Message)
	}

	for _, c := range []struct {
		name, command string
		timeout       time.Duration
		reason        Reason
		dir           string // "" means not recorded
		why           string
	}{
		{"exit", `cd sub; exit 3`, 0, ReasonNonZeroExit, "/sub", ""},
		{"failing command", `cd sub/deeper; false`, 0, ReasonNonZeroExit, "/sub/deeper", ""},
		{"set -eu", `set -eu; cd sub; ls /nonexistent`, 0, ReasonNonZeroExit, "/sub", ""},
		{"timeout", `cd sub; sleep 60`, time.Second, ReasonTimedOut, "/sub", ""},
		{"symlinked dir", `ln -sfn sub/deeper link; cd link`, 0, ReasonSucceeded, "/sub/deeper", ""},
		{"exec", `cd sub; exec true`, 0, ReasonSucceeded, "", "replaced the shell (exec)"},
		{"own EXIT trap", `trap 'echo mine' EXIT; cd sub`, 0, ReasonSucceeded, "", "EXIT trap of its own"},
		{"SIGKILL", `cd sub; kill -KILL $$`, 0, ReasonSignaled, "", "killed (SIGKILL)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := wsSpec(t, w, c.command, "", false)
			spec.Timeout = c.timeout
			res := run(t, ex, spec)
			if res.Reason != c.reason {
				t.Errorf("reason %s (%s), want %s", res.Reason, res.Message, c.reason)
			}
			switch cr := res.Carry; {
			case cr == nil:
				t.Fatal("no carry")
			case c.dir != "" && (!cr.Recorded || cr.Dir != WorkspaceHome+c.dir):
				t.Errorf("carry %+v, want %s recorded", cr, WorkspaceHome+c.dir)
			case c.dir == "" && (cr.Recorded || !strings.Contains(cr.Why, c.why)):
				t.Errorf("carry %+v, want nothing recorded because %q", cr, c.why)
			}
		})
	}
}

// The variables a shell exported are recorded with CarryEnv (unfiltered:
// the agent drops what must not carry) and given to the next task as
// carried variables, which the task's explicit Env overrides.
func TestWorkspaceCarriedEnv(t *testing.T) {
	t.Parallel()
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNone, false)
	res := run(t, ex, wsSpec(t, w, `export FOO='bar baz' MULTI=$'a\nb'; unset LANG`, "", true))
	env := map[string]string{}
	if res.Carry == nil || !res.Carry.Recorded {
		t.Fatalf("carry %+v (%s)", res.Carry, res.Message)
	}
	for _, v := range res.Carry.Env {
		env[v.Name] = v.Value
	}
	if env["FOO"] != "bar baz" || env["MULTI"] != "a\nb" {
		t.Errorf("recorded env %v lacks FOO and MULTI", env)
	}
	if _, ok := env["LANG"]; ok {
		t.Errorf("recorded env %v has the unset LANG", env)
	}
	if _, ok := env["BASH_ENV"]; ok {
		t.Errorf("recorded env %v has BASH_ENV", env)
	}
	spec := wsSpec(t, w, `echo "$FOO|$BAR"`, "", false, EnvVar{"FOO", "carried"}, EnvVar{"BAR", "carried"})
	spec.Env = []EnvVar{{"BAR", "explicit"}}
	if res := run(t, ex, spec); res.Stdout.Tail != "carried|explicit\n" {
		t.Errorf("carried FOO, explicit BAR: %q", res.Stdout.Tail)
	}
	// Without CarryEnv only the directory is recorded.
	if res := run(t, ex, wsSpec(t, w, `export FOO=x`, "", false)); res.Carry == nil || len(res.Carry.Env) != 0 {
		t.Errorf("without CarryEnv: %+v", res.Carry)
	}
}

// A start directory resolves inside the workspace: a carried one that is
// gone starts the shell at the root and says so, a required one that is
// gone fails naming it, and neither ".." nor a symbolic link planted by a
// task leads out of the workspace (RESOLVE_IN_ROOT).
func TestWorkspaceStartDirStaysInside(t *testing.T) {
	t.Parallel()
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNone, false)
	run(t, ex, wsSpec(t, w, `mkdir gone; ln -s /etc esc; ln -s ../../../.. up`, "", false))

	res := run(t, ex, wsSpec(t, w, `pwd`, "gone-already", false))
	if res.Reason != ReasonSucceeded || res.Stdout.Tail != WorkspaceHome+"\n" || !strings.Contains(res.Message, "carried working directory "+WorkspaceHome+"/gone-already is gone") {
		t.Errorf("carried dir gone: %s %q, message %q", res.Reason, res.Stdout.Tail, res.Message)
	}
	for _, dir := range []string{"../../etc", "/etc", "esc", "up/etc", WorkspaceHome + "/esc"} {
		spec := wsSpec(t, w, `pwd`, dir, false)
		spec.Workspace.DirRequired = true
		task, err := ex.Start(spec)
		if err == nil {
			res := wait(t, task)
			t.Errorf("working dir %q: started in %q (stdout %q)", dir, res.StartDir, res.Stdout.Tail)
			continue
		}
		if !errors.Is(err, ErrWorkingDirMissing) || !strings.Contains(err.Error(), WorkspaceHome) {
			t.Errorf("working dir %q: %v, want ErrWorkingDirMissing inside the workspace", dir, err)
		}
	}
	// With an etc of the workspace's own, the same paths end there.
	run(t, ex, wsSpec(t, w, `mkdir etc; touch etc/mine`, "", false))
	for _, dir := range []string{"../../etc", "/etc", "esc", "up/etc"} {
		spec := wsSpec(t, w, `pwd -P; ls`, dir, false)
		spec.Workspace.DirRequired = true
		if res := run(t, ex, spec); res.Stdout.Tail != WorkspaceHome+"/etc\nmine\n" || res.StartDir != WorkspaceHome+"/etc" {
			t.Errorf("working dir %q: started in %q, stdout %q", dir, res.StartDir, res.Stdout.Tail)
		}
	}
}

// The workspace's network namespace is shared by its tasks alone: a
// server one task runs on 127.0.0.1 for its length is reachable from
// another task of the workspace, and not from a task of another
// workspace.
func TestWorkspaceSharedLoopback(t *testing.T) {
	t.Parallel()
	ex := tenantExecutor(t)
	w1 := testWorkspace(t, ex, NetworkNone, false)
	w2 := testWorkspace(t, ex, NetworkNone, false)
	server, err := ex.Start(wsSpec(t, w1, `perl -MIO::Socket::INET -e '$|=1; $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:7411", Listen => 5, ReuseAddr => 1) or die "listen: $!"; print "listening\n"; while ($c = $s->accept) { print $c "hello from w1\n"; close $c }' & wait`, "", false))
	if err != nil {
		t.Fatal(err)
	}
	defer server.Cancel()
	waitForOutput(t, server, "listening")
	client := `exec 3<>/dev/tcp/127.0.0.1/7411 && cat <&3`
	if res := run(t, ex, wsSpec(t, w1, client, "", false)); res.Stdout.Tail != "hello from w1\n" {
		t.Errorf("same workspace: %s %q %q", res.Reason, res.Stdout.Tail, res.Stderr.Tail)
	}
	if res := run(t, ex, wsSpec(t, w2, client, "", false)); res.Reason == ReasonSucceeded || !strings.Contains(res.Stderr.Tail, "refused") {
		t.Errorf("other workspace: %s %q %q, want the connection refused", res.Reason, res.Stdout.Tail, res.Stderr.Tail)
	}
	// A task without a workspace does not reach it either.
	plain := testSpec(t, client)
	plain.Network = NetworkNone
	plain.User = &User{UID: workspaceUIDs.Add(1), GID: 1}
	if res := run(t, ex, plain); res.Reason == ReasonSucceeded {
		t.Errorf("task without a workspace: %s %q", res.Reason, res.Stdout.Tail)
	}
	server.Cancel()
	wait(t, server)
}

// A workspace with a file system of its own: a write past its size fails
// with ENOSPC in that workspace only, its used bytes come from statfs,
// and Remove leaves no mount, image or directory.
func TestWorkspaceQuota(t *testing.T) {
	t.Parallel()
	ex, _ := quotaExecutor(t, 64<<20, 128<<20, 2000)
	full := testWorkspace(t, ex, NetworkNone, true)
	other := testWorkspace(t, ex, NetworkNone, true)
	if !full.StorageEnforced() || full.CapacityBytes() != 64<<20 {
		t.Fatalf("storage enforced %v, capacity %d", full.StorageEnforced(), full.CapacityBytes())
	}
	res := run(t, ex, wsSpec(t, full, `dd if=/dev/zero of=f bs=1M count=100 2>&1; echo rc=$?`, "", false))
	if !strings.Contains(res.Stdout.Tail, "No space left on device") || strings.Contains(res.Stdout.Tail, "rc=0") {
		t.Errorf("100 MiB into 64 MiB: %q", res.Stdout.Tail)
	}
	if used, err := full.UsedBytes(); err != nil || used < 60<<20 {
		t.Errorf("used bytes %d, %v: want about 64 MiB", used, err)
	}
	if res := run(t, ex, wsSpec(t, other, `dd if=/dev/zero of=g bs=1M count=40 2>/dev/null; echo rc=$?`, "", false)); res.Stdout.Tail != "rc=0\n" {
		t.Errorf("the other workspace: %q", res.Stdout.Tail)
	}
	dir, image := full.Dir(), full.image
	if dev, err := imageMountedAt(image, dir); err != nil || dev == "" || full.sys.loop != dev {
		t.Errorf("the workspace's loop device %q, mounted from %q (%v)", full.sys.loop, dev, err)
	}
	if err := full.Remove(); err != nil {
		t.Fatal(err)
	}
	if dev, _ := imageMountedAt(image, dir); dev != "" || imageInUse(image) {
		t.Errorf("the image is still mounted after Remove")
	}
	for _, p := range []string{dir, image} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Remove: %v", p, err)
		}
	}
}

// Removing a plain-directory workspace never follows a symbolic link a
// task planted: what it points to outside stays.
func TestWorkspaceRemoveDoesNotFollowLinks(t *testing.T) {
	t.Parallel()
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNone, false)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ex, wsSpec(t, w, `mkdir -p d; ln -s `+outside+` x; ln -s `+outside+` d/y; ln -s `+outside+`/keep f`, "", false))
	if err := w.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Errorf("the link's target after Remove: %v", err)
	}
	if _, err := os.Lstat(w.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workspace directory after Remove: %v", err)
	}
}

// A workspace taken over from an earlier process (WorkspaceOptions.
// TakeOver) whose file system that process left frozen, as an agent that
// stops between the freeze and the thaw of a fork's copy does, is thawed
// before anything writes to it: without the thaw the take-over itself
// blocks, and every task's write after it.
func TestWorkspaceTakeOverThawsALeftFreeze(t *testing.T) {
	t.Parallel()
	ex, _ := quotaExecutor(t, 64<<20, 128<<20, 2000)
	w := testWorkspace(t, ex, NetworkNone, true)
	if err := w.freeze(); err != nil {
		t.Fatal(err)
	}
	o := WorkspaceOptions{ID: w.ID(), Image: w.image, UID: w.UID(), GID: w.UID(), Network: NetworkNone, TakeOver: true}
	opened := make(chan error, 1)
	var again *Workspace
	go func() {
		var err error
		again, err = ex.OpenWorkspace(o)
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatalf("OpenWorkspace taking over: %v", err)
		}
	case <-time.After(20 * time.Second):
		_ = w.thaw() // let the blocked open and the cleanup go on
		t.Fatal("the take-over blocked on the frozen file system")
	}
	t.Cleanup(func() { _ = again.Close() })
	if !again.ThawedAtOpen() {
		t.Error("ThawedAtOpen is false after thawing a frozen file system")
	}
	if err := os.WriteFile(filepath.Join(w.Dir(), "after"), []byte("x"), 0o600); err != nil {
		t.Errorf("writing after the take-over: %v", err)
	}
	w.sys.freezes = 0 // the freeze was the earlier process's, ended above
}
