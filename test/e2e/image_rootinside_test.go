package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// A workspace root inside its image (--root-inside) through the plugin,
// the controller and the agent processes: a task builds a .deb with
// dpkg-deb and installs it with apt-get as uid 0 of its user namespace
// (the workspace's UID on the node, which is not 0; the executor's
// TestImageRootInsideAptGet reads it from outside); the tenant rules hold
// (no mount, no user namespace); the package is there after a suspend
// and a resume.
func TestImageWorkspaceRootInside(t *testing.T) {
	needWorkspaces(t)
	tree := filepath.Join(t.TempDir(), "tree")
	registry.DpkgTreeForTest(t, tree)
	reg := registry.StartForTest(t)
	registry.PushForTest(t, reg, registry.DirImageForTest(t, tree), "e2e/dpkg", "1")
	ns := newNamespace(t)
	ws := createWorkspace(t, ns, "root1", "--image", reg.Ref("e2e/dpkg", "1"), "--root-inside", "--network", "None")
	if !ptr.Deref(ws.Spec.RootInside, false) {
		t.Fatalf("the workspace's spec.rootInside is unset")
	}
	uid := strconv.FormatInt(ptr.Deref(ws.Status.RunAsUser, 0), 10)
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "root1", "--", cmd)
		if code != 0 {
			t.Fatalf("task %q: exit %d\nstdout: %s\nstderr: %s", cmd, code, out, errOut)
		}
		return out
	}
	out := run(`set -e
mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/bashtask-hello
printf 'Package: bashtask-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: Test <test@example.invalid>\nDescription: test package\n' > /tmp/p/DEBIAN/control
echo hello-from-deb > /tmp/p/usr/share/bashtask-hello/greeting
dpkg-deb --root-owner-group --build /tmp/p /tmp/hello.deb >/dev/null
apt-get install -y /tmp/hello.deb >/dev/null
echo id=$(id -u)
mount -t tmpfs x /tmp 2>/dev/null && echo mount=yes || echo mount=no
unshare -U true 2>/dev/null && echo userns=yes || echo userns=no`)
	for _, want := range []string{"id=0\n", "mount=no\n", "userns=no\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the root-inside task printed no %q:\n%s", want, out)
		}
	}
	if uid == "0" {
		t.Fatalf("the workspace runs as uid 0 of the node")
	}
	checkRun := func(when string) {
		t.Helper()
		if got, want := run(`cat /usr/share/bashtask-hello/greeting; dpkg-query -W -f '${Status}\n' bashtask-hello; id -u`), "hello-from-deb\ninstall ok installed\n0\n"; got != want {
			t.Errorf("%s: %q, want %q", when, got, want)
		}
	}
	checkRun("the next task")
	for _, verb := range []string{"suspend", "resume"} {
		if out, errOut, code := plugin(t.Context(), "", "-n", ns, "workspace", verb, "root1"); code != 0 {
			t.Fatalf("workspace %s: exit %d\nstdout: %s\nstderr: %s", verb, code, out, errOut)
		}
	}
	checkRun("after a suspend and a resume")
}
