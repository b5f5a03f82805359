//go:build linux

package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// workspaceClient is a Workspaces client of r with the controller's
// certificate.
func (r *rig) workspaceClient() agentv1.WorkspacesClient {
	r.t.Helper()
	return agentv1.NewWorkspacesClient(r.dial(r.ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}))
}

// ensure makes workspace uid with network and carry settings.
func ensure(t *testing.T, wc agentv1.WorkspacesClient, uid, network string, carryEnv bool) *agentv1.WorkspaceStatus {
	t.Helper()
	resp, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref:     &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + uid, Uid: uid},
		Network: network, CarryWorkingDir: true, CarryEnv: carryEnv,
	}})
	if err != nil {
		t.Fatalf("EnsureWorkspace %s: %v", uid, err)
	}
	return resp.GetStatus()
}

// wsTask is the spec of task uid in workspace ws.
func wsTask(uid, ws, command string) *agentv1.TaskSpec {
	spec := taskSpec(uid, command)
	spec.Workspace = &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + ws, Uid: ws}
	return spec
}

// runTask starts spec and waits for its end.
func (r *rig) runTask(spec *agentv1.TaskSpec) *agentv1.TaskStatus {
	r.t.Helper()
	if _, err := r.client.Start(r.t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		r.t.Fatalf("Start %s: %v", spec.GetRef().GetUid(), err)
	}
	return r.finished(spec.GetRef().GetUid())
}

// finished waits for task uid's end.
func (r *rig) finished(uid string) *agentv1.TaskStatus {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := r.client.Get(r.t.Context(), &agentv1.GetRequest{Uid: uid})
		if err != nil {
			r.t.Fatal(err)
		}
		if st := resp.GetStatus(); st.GetState() == agentv1.TaskState_TASK_STATE_FINISHED {
			return st
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("task %s did not finish", uid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The Workspaces service at the tenant level: a workspace is made once
// (Ensure is idempotent, its immutable fields are checked), its tasks run
// as its UID with HOME at its root and share its files, the next task
// starts where the last one ended, Get and List report it, and Delete
// removes it and releases its UID.
func TestWorkspaceLifecycle(t *testing.T) {
	r := newRig(t, tenantLevel(2101100, 2101109))
	wc := r.workspaceClient()
	info, _ := r.watch()
	if caps := info.GetReadiness().GetCapabilities(); !strings.Contains(strings.Join(caps, ","), "workspaces") {
		t.Errorf("capabilities %v lack workspaces", caps)
	}
	st := ensure(t, wc, "w1", "None", false)
	if st.GetRunAsUser() < 2101100 || st.GetPath() != executor.WorkspaceHome || st.GetWorkingDir() != executor.WorkspaceHome || st.GetNetwork() != "None" {
		t.Fatalf("status %v", st)
	}
	again := ensure(t, wc, "w1", "None", false)
	if again.GetRunAsUser() != st.GetRunAsUser() {
		t.Errorf("Ensure again: UID %d, first %d", again.GetRunAsUser(), st.GetRunAsUser())
	}
	if _, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-w1", Uid: "w1"}, Network: "Egress"}}); status.Code(err) != codes.FailedPrecondition && status.Code(err) != codes.InvalidArgument {
		t.Errorf("Ensure with another network: %v, want FAILED_PRECONDITION", err)
	}

	res := r.runTask(wsTask("t1", "w1", `id -u; echo "$HOME"; echo hi > a.txt; mkdir sub; cd sub`))
	if res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != itoa(int(st.GetRunAsUser()))+"\n"+executor.WorkspaceHome+"\n" {
		t.Fatalf("t1: %s %q stdout %q stderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
	if res.GetWorkingDir() != executor.WorkspaceHome {
		t.Errorf("t1 working_dir %q", res.GetWorkingDir())
	}
	g, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if gs := g.GetStatus(); gs.GetWorkingDir() != executor.WorkspaceHome+"/sub" || gs.GetLastTaskEnd() == nil || gs.GetRunningTasks() != 0 ||
		gs.GetLastTaskName() != "task-t1" || gs.GetLastTaskUid() != "t1" {
		t.Errorf("after t1: %v", gs)
	}
	res = r.runTask(wsTask("t2", "w1", `pwd; cat ../a.txt`))
	if res.GetStdout().GetTail() != executor.WorkspaceHome+"/sub\nhi\n" || res.GetWorkingDir() != executor.WorkspaceHome+"/sub" {
		t.Errorf("t2: %s %q stdout %q stderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
	// A task that takes its own access to the root away does not lock the
	// workspace's later tasks out.
	r.runTask(wsTask("t2b", "w1", `cd ~; chmod 000 ~`))
	if res := r.runTask(wsTask("t2c", "w1", `cat ~/a.txt; stat -c %a ~`)); res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != "hi\n700\n" {
		t.Errorf("after chmod 000 ~: %s %q stdout %q stderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
	if res := r.runTask(wsTask("t3", "nope", `true`)); res.GetReason() != "StartFailed" || !strings.Contains(res.GetMessage(), "nope") {
		t.Errorf("a task of an unknown workspace: %s %q", res.GetReason(), res.GetMessage())
	}
	l, err := wc.ListWorkspaces(t.Context(), &agentv1.ListWorkspacesRequest{})
	if err != nil || len(l.GetWorkspaces()) != 1 {
		t.Fatalf("List: %v %v", l, err)
	}

	root := filepath.Join(r.dir, "workspaces", "w1")
	if _, err := os.Stat(filepath.Join(root, "a.txt")); err != nil {
		t.Errorf("the workspace's file on the node: %v", err)
	}
	if _, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "w1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("workspace root after delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "state", "workspaces", "w1")); !os.IsNotExist(err) {
		t.Errorf("workspace state after delete: %v", err)
	}
	if _, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "w1"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get after delete: %v", err)
	}
	r.srv.mu.Lock()
	_, held := r.srv.leases.held[st.GetRunAsUser()]
	r.srv.mu.Unlock()
	if held {
		t.Errorf("UID %d still leased after delete", st.GetRunAsUser())
	}
	if _, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "w1"}); err != nil {
		t.Errorf("Delete again: %v", err)
	}
}

// Carried variables: on, an exported variable reaches the next task,
// never a credential-like name or a managed one, and they stay in a file
// of the workspace's UID, mode 0600, in the state directory; off, nothing
// carries.
func TestWorkspaceCarriedEnvFiltered(t *testing.T) {
	r := newRig(t, tenantLevel(2101110, 2101119))
	wc := r.workspaceClient()
	st := ensure(t, wc, "we", "None", true)
	off := ensure(t, wc, "wo", "None", false)
	t.Cleanup(func() {
		for _, uid := range []string{"we", "wo"} {
			_, _ = wc.DeleteWorkspace(context.Background(), &agentv1.DeleteWorkspaceRequest{Uid: uid})
		}
	})
	set := `export FOO=bar GH_TOKEN=x BASHTASK_X=1 MY_SECRET=s`
	get := `echo "FOO=${FOO-} GH_TOKEN=${GH_TOKEN-} BASHTASK_X=${BASHTASK_X-} MY_SECRET=${MY_SECRET-}"`
	r.runTask(wsTask("e1", "we", set))
	if res := r.runTask(wsTask("e2", "we", get)); res.GetStdout().GetTail() != "FOO=bar GH_TOKEN= BASHTASK_X= MY_SECRET=\n" {
		t.Errorf("carry on: %q (%s)", res.GetStdout().GetTail(), res.GetMessage())
	}
	g, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"})
	if err != nil {
		t.Fatal(err)
	}
	names := g.GetStatus().GetCarryEnvNames()
	if !slices.Contains(names, "FOO") || slices.ContainsFunc(names, func(n string) bool {
		return strings.Contains(n, "TOKEN") || strings.HasPrefix(n, "BASHTASK_") || n == "PWD" || n == "HOME"
	}) {
		t.Errorf("carried names %v", names)
	}
	envFile := filepath.Join(r.dir, "state", "workspaces", "we", workspaceEnvFile)
	fi, err := os.Stat(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if sys := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o600 || sys.Uid != st.GetRunAsUser() {
		t.Errorf("env file mode %v owner %d, want 0600 and %d", fi.Mode().Perm(), sys.Uid, st.GetRunAsUser())
	}
	if b, _ := os.ReadFile(envFile); bytes.Contains(b, []byte("GH_TOKEN")) || !bytes.Contains(b, []byte("FOO=bar\x00")) {
		t.Errorf("env file %q", b)
	}

	// Every exported variable that does not carry is named with why;
	// the names each task gets anew (PWD, HOME, the managed ones) are not.
	r.runTask(wsTask("m1", "we", `export MONKEY=1 KEYCLOAK_URL=http://k BASHTASK_X=1 ENV=/x FOO=bar`))
	g, err = wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"})
	if err != nil {
		t.Fatal(err)
	}
	msg := g.GetStatus().GetCarryMessage()
	for _, want := range []string{"KEYCLOAK_URL, MONKEY (their names have the credential shapes", "credential scrub", "BASHTASK_X (the prefix BASHTASK_", "ENV (shell start-up hooks"} {
		if !strings.Contains(msg, want) {
			t.Errorf("carry message %q lacks %q", msg, want)
		}
	}
	for _, not := range []string{"PWD", "HOME", "SHLVL", "FOO"} {
		if strings.Contains(msg, not) {
			t.Errorf("carry message %q names %s, which carries or is set anew for every task", msg, not)
		}
	}
	r.runTask(wsTask("m2", "we", `export FOO=bar`))
	if g, err = wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"}); err != nil || g.GetStatus().GetCarryMessage() != "" {
		t.Errorf("carry message when everything carried: %q (%v), want none", g.GetStatus().GetCarryMessage(), err)
	}

	// A variable no next task could be started with (one environment
	// entry over MAX_ARG_STRLEN) does not carry, and says so; the
	// workspace keeps working.
	r.runTask(wsTask("big1", "we", `export BIG=$(head -c 200000 /dev/zero | tr '\0' x) FOO=baz`))
	g, err = wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"})
	if err != nil {
		t.Fatal(err)
	}
	if msg := g.GetStatus().GetCarryMessage(); !strings.Contains(msg, "BIG") || !strings.Contains(msg, "131071") {
		t.Errorf("carry message after a 200000-byte export: %q, want one naming BIG and the limit", msg)
	}
	if res := r.runTask(wsTask("big2", "we", `echo "FOO=$FOO BIG=${#BIG}"`)); res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != "FOO=baz BIG=0\n" {
		t.Errorf("after a 200000-byte export: %s %q stdout %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail())
	}
	r.runTask(wsTask("o1", "wo", set))
	if res := r.runTask(wsTask("o2", "wo", get)); res.GetStdout().GetTail() != "FOO= GH_TOKEN= BASHTASK_X= MY_SECRET=\n" {
		t.Errorf("carry off: %q", res.GetStdout().GetTail())
	}
	_ = off
	// exec: nothing recorded, the earlier state stays, the message says why.
	r.runTask(wsTask("e3", "we", `mkdir -p d; cd d`))
	r.runTask(wsTask("e4", "we", `cd /tmp; exec true`))
	g, _ = wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"})
	if gs := g.GetStatus(); gs.GetWorkingDir() != executor.WorkspaceHome+"/d" || !strings.Contains(gs.GetCarryMessage(), "exec") {
		t.Errorf("after exec: working dir %q, message %q", gs.GetWorkingDir(), gs.GetCarryMessage())
	}
	// Ending outside the workspace: the directory does not carry.
	r.runTask(wsTask("e5", "we", `cd /tmp`))
	g, _ = wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"})
	if gs := g.GetStatus(); gs.GetWorkingDir() != executor.WorkspaceHome+"/d" || !strings.Contains(gs.GetCarryMessage(), "outside the workspace") {
		t.Errorf("after cd /tmp: working dir %q, message %q", gs.GetWorkingDir(), gs.GetCarryMessage())
	}
	// The carried directory removed: the next task starts at the root and
	// its status says so.
	r.runTask(wsTask("e6", "we", `cd d; rmdir ../d`))
	res := r.runTask(wsTask("e7", "we", `pwd`))
	if res.GetStdout().GetTail() != executor.WorkspaceHome+"\n" || !strings.Contains(res.GetMessage(), "is gone") || res.GetWorkingDir() != executor.WorkspaceHome {
		t.Errorf("carried dir gone: %q %q %q", res.GetStdout().GetTail(), res.GetMessage(), res.GetWorkingDir())
	}
	// A spec working directory that does not resolve: StartFailed naming it.
	bad := wsTask("e8", "we", `pwd`)
	bad.WorkingDir = "../../etc"
	if res := r.runTask(bad); res.GetReason() != "StartFailed" || !strings.Contains(res.GetMessage(), executor.WorkspaceHome+"/etc") {
		t.Errorf("working dir ../../etc: %s %q", res.GetReason(), res.GetMessage())
	}
}

// A workspace survives the agent's restart: a new server on the same
// state directory has its files, its UID (held before any task lease)
// and its carried directory, and takes tasks in it.
func TestWorkspaceSurvivesRestart(t *testing.T) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	quota := func(c *Config) { c.Executor.DiskQuotaBytes, c.Executor.DiskQuotaCapBytes = 64<<20, 128<<20 }
	r := newRig(t, tenantLevel(2101120, 2101121), quota)
	wc := r.workspaceClient()
	st := ensure(t, wc, "wr", "None", false)
	if !st.GetStorageEnforced() || st.GetCapacityBytes() != 64<<20 {
		t.Fatalf("storage %v %d", st.GetStorageEnforced(), st.GetCapacityBytes())
	}
	r.runTask(wsTask("r1", "wr", `mkdir sub; echo kept > sub/f; cd sub`))
	if err := r.shutdown(); err != nil {
		t.Fatal(err)
	}
	r.srv.ws.closeAll()

	r2 := newRig(t, tenantLevel(2101120, 2101121), quota, func(c *Config) {
		c.StateDir, c.Executor.WorkDirRoot = filepath.Join(r.dir, "state"), r.dir
	})
	wc2 := r2.workspaceClient()
	g, err := wc2.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "wr"})
	if err != nil {
		t.Fatal(err)
	}
	if gs := g.GetStatus(); gs.GetRunAsUser() != st.GetRunAsUser() || gs.GetWorkingDir() != executor.WorkspaceHome+"/sub" || gs.GetUsedBytes() == 0 {
		t.Errorf("after restart: %v", gs)
	}
	res := r2.runTask(wsTask("r2", "wr", `pwd; cat f; id -u`))
	if want := executor.WorkspaceHome + "/sub\nkept\n" + itoa(int(st.GetRunAsUser())) + "\n"; res.GetStdout().GetTail() != want {
		t.Errorf("after restart: %q (%s %q), want %q", res.GetStdout().GetTail(), res.GetReason(), res.GetMessage(), want)
	}
	// The other UID of the range goes to a task, never the workspace's.
	if res := r2.runTask(taskSpec("r3", "id -u")); res.GetStdout().GetTail() == itoa(int(st.GetRunAsUser()))+"\n" {
		t.Errorf("a task got the workspace's UID")
	}
	if _, err := wc2.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "wr"}); err != nil {
		t.Fatal(err)
	}
}

// Deleting a workspace while a task runs in it: the task ends Cancelled,
// the mount, the image and the directories are gone and the UID is
// released. A symbolic link the task planted is not followed when the
// workspace is measured or removed.
func TestWorkspaceDeleteWhileRunning(t *testing.T) {
	for _, withQuota := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain directory", true: "file system"}[withQuota], func(t *testing.T) {
			opts := []rigOption{tenantLevel(2101130, 2101131)}
			if withQuota {
				if _, err := os.Stat("/dev/loop-control"); err != nil {
					t.Skipf("no loop devices: %v", err)
				}
				opts = append(opts, func(c *Config) { c.Executor.DiskQuotaBytes, c.Executor.DiskQuotaCapBytes = 64<<20, 64<<20 })
			}
			r := newRig(t, opts...)
			wc := r.workspaceClient()
			st := ensure(t, wc, "wd", "None", false)
			outside := t.TempDir()
			if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			spec := wsTask("d1", "wd", `ln -s `+outside+` x; ln -s /etc etc; echo started; sleep 60`)
			if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "d1"})
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(g.GetStatus().GetStdout().GetTail(), "started") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("task did not start")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if g, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "wd"}); err != nil || g.GetStatus().GetRunningTasks() != 1 {
				t.Errorf("running tasks %d, %v", g.GetStatus().GetRunningTasks(), err)
			}
			d, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "wd"})
			if err != nil {
				t.Fatal(err)
			}
			if d.GetCancelledTasks() != 1 {
				t.Errorf("cancelled %d tasks", d.GetCancelledTasks())
			}
			if res := r.finished("d1"); res.GetReason() != "Cancelled" {
				t.Errorf("task: %s %q", res.GetReason(), res.GetMessage())
			}
			for _, p := range []string{filepath.Join(r.dir, "workspaces", "wd"), filepath.Join(r.dir, "state", "workspaces", "wd")} {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s after delete: %v", p, err)
				}
			}
			if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil || bytes.Contains(b, []byte(filepath.Join(r.dir, "workspaces", "wd"))) {
				t.Errorf("still mounted after delete (%v)", err)
			}
			if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
				t.Errorf("the planted link's target: %v", err)
			}
			if _, err := os.Stat("/etc/passwd"); err != nil {
				t.Errorf("/etc/passwd: %v", err)
			}
			r.srv.mu.Lock()
			_, held := r.srv.leases.held[st.GetRunAsUser()]
			r.srv.mu.Unlock()
			if held {
				t.Errorf("UID %d still leased", st.GetRunAsUser())
			}
		})
	}
}

// At the process level the agent holds no workspaces.
func TestWorkspacesNeedTenantLevel(t *testing.T) {
	r := newRig(t)
	_, err := r.workspaceClient().EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
		Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "w", Uid: "w"}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--isolation=tenant") {
		t.Errorf("EnsureWorkspace at the process level: %v", err)
	}
}

// mountAt is a mount of /proc/self/mountinfo: its id and source.
type mountAt struct{ id, source string }

// mountsAt lists the mounts whose mount point is dir, in mount order.
func mountsAt(t *testing.T, dir string) []mountAt {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []mountAt
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		// id parent major:minor root point options [optional...] - type source super
		sep := slices.Index(f, "-")
		if len(f) > 4 && sep > 0 && len(f) > sep+2 && f[4] == dir {
			out = append(out, mountAt{id: f[0], source: f[sep+2]})
		}
	}
	return out
}

// A workspace's file system after the agent's restart: where it is still
// mounted (the agent's process restarted on the same host) the new
// server takes up that mount and mounts nothing over it; where it is not
// (an agent container's restart loses its mounts, the image stays on the
// node) the new server mounts the image again, and the files are there.
func TestWorkspaceRestartMounts(t *testing.T) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	for name, tc := range map[string]struct {
		first   uint32
		unmount bool
	}{
		"still mounted, a local restart": {first: 2101150},
		"not mounted, a new pod":         {first: 2101152, unmount: true},
	} {
		t.Run(name, func(t *testing.T) {
			quota := func(c *Config) { c.Executor.DiskQuotaBytes, c.Executor.DiskQuotaCapBytes = 64<<20, 64<<20 }
			r := newRig(t, tenantLevel(tc.first, tc.first+1), quota)
			wc := r.workspaceClient()
			if st := ensure(t, wc, "wm", "None", false); !st.GetStorageEnforced() {
				t.Fatalf("storage not enforced: %v", st)
			}
			if res := r.runTask(wsTask("m1", "wm", `echo kept > f`)); res.GetReason() != "Succeeded" {
				t.Fatalf("m1: %s %q", res.GetReason(), res.GetMessage())
			}
			wsDir := filepath.Join(r.dir, "workspaces")
			root := filepath.Join(wsDir, "wm")
			image := filepath.Join(r.dir, "state", "workspaces", "wm", "disk.img")
			before := mountsAt(t, root)
			if len(before) != 1 || !strings.HasPrefix(before[0].source, "/dev/loop") {
				t.Fatalf("mounts at %s before the restart: %v, want one of a loop device", root, before)
			}
			if err := r.shutdown(); err != nil {
				t.Fatal(err)
			}
			r.srv.ws.closeAll()
			if tc.unmount {
				// What a new container's mount namespace lacks: the
				// workspace's file system and the workspaces' directory.
				for _, dir := range []string{root, wsDir} {
					if err := syscall.Unmount(dir, 0); err != nil {
						t.Fatalf("unmounting %s: %v", dir, err)
					}
				}
				if m := mountsAt(t, root); len(m) != 0 {
					t.Fatalf("still mounted at %s: %v", root, m)
				}
				if _, err := os.Stat(filepath.Join(root, "f")); !os.IsNotExist(err) {
					t.Fatalf("the file without the mount: %v", err)
				}
				// A new pod starts once every process of the old one is
				// gone. Until then a process that exits (the first task's
				// shim) may still hold the file system in its mount
				// namespace, unflushed; mounting the image a second time
				// then reads it stale. The loop device clears itself
				// (LO_FLAGS_AUTOCLEAR) when the last hold ends.
				waitLoopCleared(t, before[0].source, image)
			}

			r2 := newRig(t, tenantLevel(tc.first, tc.first+1), quota, func(c *Config) {
				c.StateDir, c.Executor.WorkDirRoot = filepath.Join(r.dir, "state"), r.dir
			})
			after := mountsAt(t, root)
			switch {
			case len(after) != 1:
				t.Errorf("mounts at %s after the restart: %v, want one", root, after)
			case !tc.unmount && after[0] != before[0]:
				t.Errorf("mount at %s after a local restart: %v, want the one before, %v", root, after[0], before[0])
			case tc.unmount && !strings.HasPrefix(after[0].source, "/dev/loop"):
				t.Errorf("mount at %s after a new pod: %v, want a loop device", root, after[0])
			}
			if len(after) == 1 {
				dev := strings.TrimPrefix(after[0].source, "/dev/")
				b, err := os.ReadFile("/sys/block/" + dev + "/loop/backing_file")
				if got := strings.TrimSpace(string(b)); err != nil || got != image {
					t.Errorf("%s backed by %q (%v), want %s", after[0].source, got, err, image)
				}
			}
			if res := r2.runTask(wsTask("m2", "wm", `cat f; df --output=target . | tail -n1`)); res.GetStdout().GetTail() != "kept\n"+executor.WorkspaceHome+"\n" {
				t.Errorf("after the restart: %s %q stdout %q stderr %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
			}
			if _, err := r2.workspaceClient().DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "wm"}); err != nil {
				t.Fatal(err)
			}
			if m := mountsAt(t, root); len(m) != 0 {
				t.Errorf("mounted at %s after the deletion: %v", root, m)
			}
		})
	}
}

// waitLoopCleared waits until the loop device dev (/dev/loopN) no longer
// has image as its backing file: the file system on it is released in
// every mount namespace. It fails the test after 10 s.
func waitLoopCleared(t *testing.T, dev, image string) {
	t.Helper()
	backing := filepath.Join("/sys/block", strings.TrimPrefix(dev, "/dev/"), "loop", "backing_file")
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(backing)
		if err != nil || strings.TrimSpace(string(b)) != image {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still backed by %s 10 s after the unmount: a process still holds its file system", dev, image)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
