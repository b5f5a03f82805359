package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/client"
)

// copyTree is a small tree of what a copy must keep: modes (a read-only
// directory with contents, a sticky one, an executable), symbolic links
// (relative and dangling), an empty directory and a name that needs
// quoting.
func copyTree(t *testing.T, dir string) {
	t.Helper()
	mk := func(p string, mode fs.FileMode, body string) {
		t.Helper()
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("a.txt", 0o640, "a\n")
	mk("bin/run", 0o755, "#!/bin/sh\necho run\n")
	mk("ro/inside", 0o444, "r")
	mk(`it's "q" & $x`, 0o600, "quoted")
	for _, d := range []string{"empty", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), fs.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "rel-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nowhere", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dir, "ro"), 0o755) })
}

// treeListing lists a tree's entries: name, mode, link target or content.
func treeListing(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()
		extra := ""
		switch {
		case mode&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			extra, mode = "-> "+l, fs.ModeSymlink
		case mode.IsRegular():
			c, _ := os.ReadFile(p)
			extra = string(c)
		}
		if rel == "." {
			return nil // the top's mode depends on how it was made
		}
		b.WriteString(rel + " " + mode.String() + " " + extra + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func chmodBack(t *testing.T, dir string) {
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dir, "ro"), 0o755) })
}

// TestCopyRoundTrip copies a tree into a workspace and back with
// `kubectl bashtask cp`: every mode, link and empty directory is the
// same, the workspace's task sees them with the workspace's UID, the
// destinations follow kubectl cp's rules, and a missing path is named.
func TestCopyRoundTrip(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "cp1", "--owner", "o1", "--network", "None")
	local := filepath.Join(t.TempDir(), "tree")
	copyTree(t, local)
	want := treeListing(t, local)

	cp := func(args ...string) {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", append([]string{"-n", ns, "cp"}, args...)...)
		if code != 0 {
			t.Fatalf("cp %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
		}
	}
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "cp1", "--owner", "o1", "--", cmd)
		if code != 0 {
			t.Fatalf("run %q: exit %d: %s", cmd, code, errOut)
		}
		return out
	}

	// Onto a missing path: the tree becomes it.
	cp(local, "cp1:tree")
	got := run(`cd ~/tree && stat -c '%n %A %U' a.txt bin/run ro ro/inside tmp empty rel-link && readlink dangling`)
	wantRemote := "a.txt -rw-r----- task\nbin/run -rwxr-xr-x task\nro dr-xr-xr-x task\nro/inside -r--r--r-- task\n" +
		"tmp drwxrwxrwt task\nempty drwxr-x--- task\nrel-link lrwxrwxrwx task\n/nowhere\n"
	if got != wantRemote {
		t.Errorf("in the workspace:\n%s\nwant:\n%s", got, wantRemote)
	}
	// Onto an existing directory: inside it under its own name.
	cp(local, "cp1:/tree")
	if got := run(`test -d ~/tree/tree && echo inside`); got != "inside\n" {
		t.Errorf("a tree copied onto an existing directory: %q, want it inside", got)
	}
	// A file onto an existing directory goes inside it.
	cp(filepath.Join(local, "a.txt"), "cp1:/home/task/tree/bin")
	if got := run(`cat ~/tree/bin/a.txt`); got != "a\n" {
		t.Errorf("a file copied onto a directory: %q", got)
	}
	// Copies leave the workspace's carried directory as it was.
	if got := run(`chmod -R u+w ~/tree/tree && rm -rf ~/tree/tree ~/tree/bin/a.txt && cd ~/tree && pwd`); got != "/home/task/tree\n" {
		t.Fatalf("pwd %q", got)
	}

	back := filepath.Join(t.TempDir(), "back")
	cp("cp1:tree", back)
	chmodBack(t, back)
	cp("cp1:tree", back) // merged into the existing directory
	if got := run(`pwd`); got != "/home/task/tree\n" {
		t.Errorf("after the copies the next task starts in %q, want the carried /home/task/tree", got)
	}
	if got := treeListing(t, back); got != want {
		t.Errorf("the tree after a round trip:\n%s\nwant:\n%s", got, want)
	}
	// A file onto an existing local directory goes inside it.
	cp("cp1:tree/a.txt", back+"/bin")
	if b, err := os.ReadFile(filepath.Join(back, "bin", "a.txt")); err != nil || string(b) != "a\n" {
		t.Errorf("a file copied into a local directory: %q, %v", b, err)
	}

	_, errOut, code := plugin(t.Context(), "", "-n", ns, "cp", "cp1:no/such", filepath.Join(t.TempDir(), "x"))
	if code == 0 || !strings.Contains(errOut, "cp1:no/such: No such file or directory") {
		t.Errorf("cp of a missing path: exit %d, stderr %q; want it named", code, errOut)
	}
	// tar's own failure: its stderr and exit status.
	run(`echo s > ~/secret && chmod 000 ~/secret`)
	_, errOut, code = plugin(t.Context(), "", "-n", ns, "cp", "cp1:secret", filepath.Join(t.TempDir(), "x"))
	if code == 0 || !strings.Contains(errOut, "secret: Cannot open: Permission denied") || !strings.Contains(errOut, "exit 2") {
		t.Errorf("cp of an unreadable file: exit %d, stderr %q; want tar's message and exit 2", code, errOut)
	}
}

// copyBytes is the size of the throughput test's file: 50 MiB.
const copyBytes = 50 << 20

// TestCopyThroughput copies a 50 MiB file of random bytes out of a
// workspace with `kubectl bashtask cp` (and, with streamed stdin, into
// one with the Go client and back) and checks its sha256. It logs each
// way's rate; the figure is make bench's (workspace.cp_*_mb_s), since a
// timed assertion fails on a busy machine. E2E_MIN_COPY_MBPS makes a rate
// below it a failure, for a quiet machine.
func TestCopyThroughput(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "cp2", "--owner", "o1", "--network", "None")
	c := outputClient(t, adminConfig(t))
	dir := t.TempDir()

	// Download of a file made in the workspace.
	out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "cp2", "--owner", "o1", "--",
		`head -c `+strconv.Itoa(copyBytes)+` /dev/urandom > big && sha256sum big`)
	if code != 0 {
		t.Fatalf("making the file: exit %d: %s", code, errOut)
	}
	remoteSum, _, _ := strings.Cut(out, " ")
	// Through the plugin's binary, as a user runs it: the test binary is
	// built with the race detector, which slows the client's TLS and
	// HTTP/2 several times over.
	start := time.Now()
	if out, errOut, code := plugin(t.Context(), "", "-n", ns, "cp", "cp2:big", filepath.Join(dir, "down")); code != 0 {
		t.Fatalf("cp: exit %d: %s %s", code, out, errOut)
	}
	rateCheck(t, "download", time.Since(start))
	if got := fileSum(t, filepath.Join(dir, "down")); got != remoteSum {
		t.Fatalf("downloaded sha256 %s, the workspace's %s", got, remoteSum)
	}

	// Upload and back.
	up := filepath.Join(dir, "up")
	f, err := os.Create(up)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, copyBytes); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = c.CopyTo(t.Context(), ns, "cp2", up, "up", client.CopyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rateCheck(t, "upload", time.Since(start))
	if err := c.CopyFrom(t.Context(), ns, "cp2", "up", filepath.Join(dir, "up-back"), client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if a, b := fileSum(t, up), fileSum(t, filepath.Join(dir, "up-back")); a != b {
		t.Fatalf("after the upload and back sha256 %s, want %s", b, a)
	}
}

// minCopyRate is the floor of a copy's rate in MB/s: E2E_MIN_COPY_MBPS,
// or 0 (none) when unset.
func minCopyRate(t *testing.T) float64 {
	t.Helper()
	v := os.Getenv("E2E_MIN_COPY_MBPS")
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		t.Fatalf("E2E_MIN_COPY_MBPS=%q: want a number of MB/s", v)
	}
	return f
}

func rateCheck(t *testing.T, what string, d time.Duration) {
	t.Helper()
	rate := float64(copyBytes) / d.Seconds() / 1e6
	t.Logf("%s of %d bytes: %v, %.1f MB/s", what, copyBytes, d.Round(time.Millisecond), rate)
	if floor := minCopyRate(t); floor > 0 && rate < floor {
		t.Errorf("%s at %.1f MB/s, want at least %.0f MB/s", what, rate, floor)
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
