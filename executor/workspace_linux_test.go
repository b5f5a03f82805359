//go:build linux

package executor

import (
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
	base := t.TempDir()
	o := WorkspaceOptions{ID: filepath.Base(base), Dir: filepath.Join(base, "ws"), UID: uid, GID: uid, Network: network}
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
