//go:build linux

package agent

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	rigregistry "github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// A workspace whose tasks are root inside their image
// (ImageSpec.root_inside): a task builds a .deb with dpkg-deb and
// installs it with apt-get as uid 0 of its user namespace; the package
// is there in the next task, and after a snapshot and a restore on a
// second agent (a suspend and a resume). The workspace keeps its
// root_inside: a request asking otherwise is FAILED_PRECONDITION, and
// root_inside on the node's root is INVALID_ARGUMENT.
func TestImageRootInsideWorkspaceRestores(t *testing.T) {
	tree := filepath.Join(t.TempDir(), "tree")
	rigregistry.DpkgTreeForTest(t, tree)
	reg := newImageRegistry(t)
	ref, digest := reg.pushImage(t, "tools/dpkg:1", rigregistry.DirImageForTest(t, tree))
	bucket := t.TempDir()
	a := newRig(t, tenantLevel(2101530, 2101539), withBucket(bucket), withImages(reg, nil))
	wa := a.workspaceClient()
	ensureImage(t, wa, wsSpec("r1", 1, &agentv1.ImageSpec{Reference: ref, RootInside: true}), true)
	task := func(uid, cmd string, epoch int64) *agentv1.TaskSpec {
		s := wsTask(uid, "r1", cmd)
		s.Workspace.Epoch = epoch
		return s
	}
	install := `set -e
mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/bashtask-hello
printf 'Package: bashtask-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: Test <test@example.invalid>\nDescription: test package\n' > /tmp/p/DEBIAN/control
echo hello-from-deb > /tmp/p/usr/share/bashtask-hello/greeting
dpkg-deb --root-owner-group --build /tmp/p /tmp/hello.deb >/dev/null
apt-get install -y /tmp/hello.deb >/dev/null
id -u`
	if res := a.runTask(task("t1", install, 1)); res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != "0\n" {
		t.Fatalf("t1: %s %s %q %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetStderr().GetTail())
	}
	check := `cat /usr/share/bashtask-hello/greeting; dpkg-query -W -f '${Status}\n' bashtask-hello`
	want := "hello-from-deb\ninstall ok installed\n"
	if res := a.runTask(task("t2", check, 1)); res.GetStdout().GetTail() != want {
		t.Errorf("t2: %s %s %q, want %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), want)
	}
	_, err := wa.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: wsSpec("r1", 1, &agentv1.ImageSpec{Reference: ref})})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "root inside") {
		t.Errorf("Ensure without root_inside: %v, want FAILED_PRECONDITION naming root inside", err)
	}
	_, err = wa.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: wsSpec("r2", 1, &agentv1.ImageSpec{NodeRoot: true, RootInside: true})})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "image.root_inside") {
		t.Errorf("root_inside on the node's root: %v, want INVALID_ARGUMENT naming image.root_inside", err)
	}
	snap, err := wa.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	b := newRig(t, tenantLevel(2101540, 2101549), withBucket(bucket), withImages(reg, nil))
	spec := wsSpec("r1", 2, &agentv1.ImageSpec{Reference: ref, Digest: digest, RootInside: true})
	spec.RestoreFrom = snap.GetSnapshot()
	ensureImage(t, b.workspaceClient(), spec, true)
	if res := b.runTask(task("t3", check+"; id -u", 2)); res.GetStdout().GetTail() != want+"0\n" {
		t.Errorf("t3 in the restored workspace: %s %s %q, want %q (stderr %q)", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), want+"0\n", res.GetStderr().GetTail())
	}
}
