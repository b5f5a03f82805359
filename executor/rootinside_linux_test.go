//go:build linux

package executor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// buildDpkgImage builds registry.DpkgTreeForTest's image as a layer
// directory others may traverse.
func buildDpkgImage(t *testing.T) testImage {
	t.Helper()
	layer := filepath.Join(traversableTempDir(t), "layer")
	registry.DpkgTreeForTest(t, layer)
	return testImage{ref: "localhost/bashtask/dpkg-test:1", layers: []string{layer}}
}

// debBuild is a task's script that builds the package bashtask-hello
// (one file, /usr/share/bashtask-hello/greeting) with dpkg-deb into
// /tmp/hello.deb.
const debBuild = `set -e
mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/bashtask-hello
printf 'Package: bashtask-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: Test <test@example.invalid>\nDescription: test package\n' > /tmp/p/DEBIAN/control
echo hello-from-deb > /tmp/p/usr/share/bashtask-hello/greeting
dpkg-deb --root-owner-group --build /tmp/p /tmp/hello.deb >/dev/null
set +e
`

// A workspace task root inside its image installs a .deb it built with
// apt-get (and so dpkg), as uid 0 of its user namespace while the node
// sees its UID, with no capability; the package is there for the next
// task, and root inside keeps every tenant rule: no mount, no user
// namespace, no other UID's files, Landlock, no set-ID.
func TestImageRootInsideAptGet(t *testing.T) {
	t.Parallel()
	img := buildDpkgImage(t)
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNode, false)
	upper, work, err := w.RootDirs()
	if err != nil {
		t.Fatal(err)
	}
	root := img.root()
	root.UpperDir, root.WorkDir, root.RootInside = upper, work, true
	spec := wsSpec(t, w, debBuild+`echo id=$(id -u):$(id -g) cap=$(grep CapEff /proc/self/status | tr -d '\t')
apt-get install -y /tmp/hello.deb 2>&1; echo apt=$?
ls -ln /tmp /tmp/hello.deb
echo owner=$(stat -c %u:%g /usr/share/bashtask-hello/greeting)
while [ ! -e ~/go ]; do sleep 0.05; done`, "", false)
	spec.Root = root
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	waitForOutput(t, task, "owner=")
	status := readShellStatus(t, task.PID())
	writeFile(t, filepath.Join(w.Dir(), "go"), "")
	res := wait(t, task)
	wants := []string{"id=0:0 cap=CapEff:0000000000000000\n", "apt=0\n", "owner=0:0\n"}
	for _, want := range wants {
		if res.Reason != ReasonSucceeded || !strings.Contains(res.Stdout.Tail, want) {
			t.Errorf("first task: %s: %s: stdout lacks %q:\n%s\nstderr:\n%s", res.Reason, res.Message, want, res.Stdout.Tail, res.Stderr.Tail)
		}
	}
	uid := strconv.FormatUint(uint64(w.uid), 10)
	if !strings.Contains(status, "Uid:\t"+uid+"\t"+uid+"\t"+uid+"\t"+uid+"\n") {
		t.Errorf("the node sees the task's shell as\n%s\nwant Uid %s (the workspace's)", status, uid)
	}
	spec = wsSpec(t, w, `cat /usr/share/bashtask-hello/greeting; dpkg-query -W -f '${Status}\n' bashtask-hello`, "", false)
	spec.Root = root
	res = run(t, ex, spec)
	if want := "hello-from-deb\ninstall ok installed\n"; res.Reason != ReasonSucceeded || res.Stdout.Tail != want {
		t.Errorf("next task: %s: %s: stdout %q, want %q\n%s", res.Reason, res.Message, res.Stdout.Tail, want, res.Stderr.Tail)
	}
	for _, p := range []string{"usr/share/bashtask-hello/greeting", shim.AptSandboxConf} {
		if _, err := os.Stat(filepath.Join(w.Dir(), upper, p)); err != nil {
			t.Errorf("%s is not in the workspace's upper directory: %v", p, err)
		}
	}
}

// readShellStatus is /proc/PID/status, as the node sees it, of the
// shell: the child of the task's shim, shim.
func readShellStatus(t *testing.T, shim int) string {
	t.Helper()
	p := strconv.Itoa(shim)
	children, err := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
	if err != nil || len(strings.Fields(string(children))) != 1 {
		t.Fatalf("the shim's children: %q, %v; want the shell alone", children, err)
	}
	b, err := os.ReadFile("/proc/" + strings.Fields(string(children))[0] + "/status")
	if err != nil {
		t.Fatalf("reading the shell's status: %v", err)
	}
	return string(b)
}

// Root inside keeps the tenant rules: the task, uid 0 of its namespace,
// cannot mount, make a user namespace, read a file of another UID
// (0600), write where Landlock forbids (/proc/sys) or gain anything
// from a set-user-ID file; and it runs under the seccomp filter, which the
// second stage reads from its memfd.
func TestImageRootInsideTenantRules(t *testing.T) {
	t.Parallel()
	img := buildDpkgImage(t)
	copyFile(t, staticBash, filepath.Join(img.layers[0], "usr/bin/suid-bash"), 0o755)
	mustChmod(t, filepath.Join(img.layers[0], "usr/bin/suid-bash"), 0o4755)
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNode, false)
	upper, work, err := w.RootDirs()
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(w.Dir(), "secret")
	writeFile(t, secret, "s3cret\n")
	mustChmod(t, secret, 0o600)
	if err := os.Chown(secret, int(w.uid)+1, int(w.gid)+1); err != nil {
		t.Fatal(err)
	}
	root := img.root()
	root.UpperDir, root.WorkDir, root.RootInside = upper, work, true
	spec := wsSpec(t, w, `mkdir -p /mnt
mount -t tmpfs x /mnt 2>/dev/null && echo mount=yes || echo mount=no
unshare -U true 2>/dev/null && echo userns=yes || echo userns=no
unshare -m true 2>/dev/null && echo mountns=yes || echo mountns=no
cat ~/secret 2>/dev/null && echo read=yes || echo read=no
echo 1 > /proc/sys/kernel/hostname 2>/dev/null && echo procsys=yes || echo procsys=no
echo suid=$(suid-bash -pc 'grep -E "^(Uid|CapEff)" /proc/self/status' | tr -d '\t\n')
chroot / true 2>/dev/null && echo chroot=yes || echo chroot=no
while read -r k v; do if [ "$k" = Seccomp: ]; then echo seccomp=$v; fi; done < /proc/self/status`, "", false)
	spec.Root = root
	res := run(t, ex, spec)
	wants := []string{"mount=no\n", "userns=no\n", "mountns=no\n", "read=no\n", "procsys=no\n",
		"suid=Uid:0000CapEff:0000000000000000\n", "chroot=no\n", "seccomp=2\n"}
	for _, want := range wants {
		if res.Reason != ReasonSucceeded || !strings.Contains(res.Stdout.Tail, want) {
			t.Errorf("%s: %s: stdout lacks %q:\n%s\nstderr:\n%s", res.Reason, res.Message, want, res.Stdout.Tail, res.Stderr.Tail)
		}
	}
}

// Root inside needs the task's own UID.
func TestImageRootInsideNeedsUID(t *testing.T) {
	t.Parallel()
	img := buildTestImage(t, true)
	ex := tenantExecutor(t)
	spec := testSpec(t, "true")
	spec.Root = img.root()
	spec.Root.RootInside = true
	_, err := ex.Start(spec)
	if err == nil || !strings.Contains(err.Error(), "spec.root.rootInside") {
		t.Fatalf("Start: %v, want an error naming spec.root.rootInside", err)
	}
}
