package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginRunSessionInWorkspace: run -w takes the workspace's owner; a
// server started with --detach is a task of its own that the next
// commands reach on 127.0.0.1 while it runs (a background process of a
// command would end with it, with a note); cp into a directory that does
// not exist says so, naming the path; the first task after a resume
// says the workspace was restored.
func TestPluginRunSessionInWorkspace(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "s1", "--owner", "o1", "--network", "None")
	run := func(args ...string) (string, string, int) {
		return plugin(t.Context(), "", append([]string{"-n", ns, "run", "-w", "s1"}, args...)...)
	}
	// Without --owner: the workspace's, which it must be to run there.
	if out, errOut, code := run("--", "echo hi"); code != 0 || out != "hi\n" {
		t.Fatalf("run -w s1 without --owner: exit %d, %q %q", code, out, errOut)
	}

	// A background process ends with its command, and run says so.
	server := `exec python3 -m http.server 8765 --bind 127.0.0.1`
	if _, errOut, code := run("--", server+" >/dev/null 2>&1 & sleep 0.5"); code != 0 || !strings.Contains(errOut, "--detach") {
		t.Errorf("a server in the background of a command: exit %d, stderr %q; want a note pointing to --detach", code, errOut)
	}
	name, errOut, code := run("--detach", "--timeout", "2m", "--", server)
	name = strings.TrimSpace(name)
	if code != 0 || name == "" || !strings.Contains(errOut, "kubectl bashtask cancel -n "+ns+" "+name) {
		t.Fatalf("run --detach: exit %d, stdout %q, stderr %q", code, name, errOut)
	}
	fetch := `for i in $(seq 50); do exec 3<>/dev/tcp/127.0.0.1/8765 && break; sleep 0.1; done; printf 'GET / HTTP/1.0\r\n\r\n' >&3; head -1 <&3`
	if out, errOut, code := run("--", fetch); code != 0 || !strings.HasPrefix(out, "HTTP/1.0 200") {
		t.Errorf("the detached server from the next command: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := plugin(t.Context(), "", "-n", ns, "cancel", name); code != 0 {
		t.Errorf("cancel %s: exit %d, %q %q", name, code, out, errOut)
	}

	// The first task after a resume says the workspace was restored.
	for _, verb := range []string{"suspend", "resume"} {
		if out, errOut, code := plugin(t.Context(), "", "-n", ns, "workspace", verb, "s1"); code != 0 {
			t.Fatalf("workspace %s: exit %d, %q %q", verb, code, out, errOut)
		}
	}
	if _, errOut, code := run("--", "true"); code != 0 || !strings.Contains(errOut, "workspace s1 was restored on") {
		t.Errorf("the first task after a resume: exit %d, stderr %q; want the restore notice", code, errOut)
	}

	local := filepath.Join(t.TempDir(), "f.txt")
	if err := os.WriteFile(local, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = plugin(t.Context(), "", "-n", ns, "cp", local, "s1:nodir/sub/f.txt")
	if code == 0 || !strings.Contains(errOut, "s1:nodir/sub/f.txt: No such file or directory") || strings.Contains(errOut, "stdin") {
		t.Errorf("cp into a missing directory: exit %d, stderr %q; want cp's words naming the path", code, errOut)
	}
}
