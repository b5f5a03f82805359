//go:build linux

package executor

import (
	"debug/elf"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// dpkgImagePrograms are the node's programs a dpkg image holds, with the
// libraries they load: dpkg and apt-get and what they run.
var dpkgImagePrograms = []string{
	"/usr/bin/dpkg", "/usr/bin/dpkg-deb", "/usr/bin/dpkg-query", "/usr/bin/dpkg-split", "/usr/bin/dpkg-divert",
	"/usr/bin/dpkg-trigger", "/usr/bin/dpkg-maintscript-helper", "/usr/bin/apt-get", "/usr/bin/apt-config",
	"/usr/lib/apt/methods/file", "/usr/lib/apt/methods/copy", "/usr/lib/apt/methods/store",
	"/usr/bin/tar", "/usr/sbin/ldconfig", "/usr/sbin/start-stop-daemon",
}

// dpkgImageApplets are the busybox applets of a dpkg image.
var dpkgImageApplets = []string{"sh", "cat", "ls", "id", "grep", "stat", "sleep", "mkdir", "printf", "echo", "rm",
	"diff", "mount", "unshare", "chroot", "touch", "test", "true", "head", "tr", "sed", "mv", "chmod", "chown", "cp"}

// libDirs are where buildDpkgImage looks for a program's libraries.
var libDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"}

// buildDpkgImage builds a one-layer image with Debian's dpkg and apt-get
// from the node's own (usr-merged: /bin, /sbin, /lib and /lib64 link into
// /usr), bash-static as /bin/bash, busybox's applets, an empty dpkg
// database, and apt's partial directories owned by uid 100, mode 0700,
// as Debian's _apt owns them. It skips without dpkg, apt-get or the
// static programs.
func buildDpkgImage(t *testing.T) testImage {
	t.Helper()
	for _, p := range append([]string{staticBash, staticBusybox}, dpkgImagePrograms...) {
		if _, err := os.Stat(p); err != nil {
			testutil.SkipUnlessStrictf(t, "%s missing (a Debian node has dpkg and apt; hack/test-packages.sh installs the static programs): %v", p, err)
		}
	}
	layer := filepath.Join(traversableTempDir(t), "layer")
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc/apt/apt.conf.d", "etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/dpkg/dpkg.cfg.d", "usr/share/dpkg",
		"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/lib/dpkg/alternatives",
		"var/lib/apt/lists", "var/cache/apt/archives", "var/log/apt", "tmp", "root"} {
		mkdirAll(t, filepath.Join(layer, d), 0o755)
	}
	mustChmod(t, filepath.Join(layer, "tmp"), 0o1777)
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(layer, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"var/lib/apt/lists/partial", "var/cache/apt/archives/partial"} {
		mkdirAll(t, filepath.Join(layer, d), 0o700)
		if err := os.Chown(filepath.Join(layer, d), 100, 0); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, staticBash, filepath.Join(layer, "usr/bin/bash"), 0o755)
	copyFile(t, staticBusybox, filepath.Join(layer, "usr/bin/busybox"), 0o755)
	for _, a := range dpkgImageApplets {
		if err := os.Symlink("busybox", filepath.Join(layer, "usr/bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"cputable", "ostable", "tupletable", "abitable"} {
		copyFile(t, "/usr/share/dpkg/"+table, filepath.Join(layer, "usr/share/dpkg", table), 0o644)
	}
	copied := map[string]bool{}
	for _, p := range dpkgImagePrograms {
		copyWithLibraries(t, layer, p, copied)
	}
	for name, content := range map[string]string{
		"etc/passwd":               "root:x:0:0:root:/root:/bin/bash\n_apt:x:100:65534::/nonexistent:/usr/sbin/nologin\n",
		"etc/group":                "root:x:0:\n",
		"etc/os-release":           "ID=bashtask-dpkg-image\n",
		"etc/apt/sources.list":     "",
		"var/lib/dpkg/status":      "",
		"var/lib/dpkg/available":   "",
		"var/lib/dpkg/arch-native": "",
	} {
		writeFile(t, filepath.Join(layer, name), content)
	}
	return testImage{ref: "localhost/bashtask/dpkg-test:1", layers: []string{layer}}
}

// copyWithLibraries copies the node's program p into layer at its path
// (/lib64 and the like taken as their /usr paths), with its ELF
// interpreter and the libraries it needs, found in libDirs, once each.
func copyWithLibraries(t *testing.T, layer, p string, copied map[string]bool) {
	t.Helper()
	if copied[p] {
		return
	}
	copied[p] = true
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(layer, usrMerged(p))
	mkdirAll(t, filepath.Dir(dst), 0o755)
	copyFile(t, real, dst, 0o755)
	f, err := elf.Open(real)
	if err != nil {
		return // a script (dpkg-maintscript-helper)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err == nil {
				copyWithLibraries(t, layer, strings.TrimRight(string(b), "\x00"), copied)
			}
		}
	}
	libs, _ := f.ImportedLibraries()
	for _, lib := range libs {
		found := ""
		for _, d := range libDirs {
			if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
				found = filepath.Join(d, lib)
				break
			}
		}
		if found == "" {
			t.Fatalf("library %s of %s not found in %v", lib, p, libDirs)
		}
		copyWithLibraries(t, layer, found, copied)
	}
}

// usrMerged is p with /bin, /sbin, /lib and /lib64 taken as their /usr
// paths, as in a usr-merged image.
func usrMerged(p string) string {
	for _, d := range []string{"/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(p, d) {
			return "/usr" + p
		}
	}
	return p
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
// from a set-user-ID file.
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
chroot / true 2>/dev/null && echo chroot=yes || echo chroot=no`, "", false)
	spec.Root = root
	res := run(t, ex, spec)
	wants := []string{"mount=no\n", "userns=no\n", "mountns=no\n", "read=no\n", "procsys=no\n",
		"suid=Uid:0000CapEff:0000000000000000\n", "chroot=no\n"}
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
