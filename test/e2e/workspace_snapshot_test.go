package e2e

import (
	"strings"
	"testing"
	"time"
)

// The plugin's snapshot, suspend and resume of a workspace of 100 MiB
// through the local cluster's S3 bucket: the files come back after the
// suspend, and get shows the phase and the snapshot's age. It logs how
// long the resume took until the first task had started (the figure of
// docs/workspaces.md).
func TestPluginWorkspaceSnapshotSuspendResume(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "snap", "--owner", "o1", "--network", "None")
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "snap", "--owner", "o1", "--", cmd)
		if code != 0 {
			t.Fatalf("run %q: exit %d\nstdout: %s\nstderr: %s", cmd, code, out, errOut)
		}
		return out
	}
	sum := run(`head -c 104857600 /dev/urandom > data && mkdir -p src/empty && echo hi > src/a && ln -s a src/link && sha256sum data`)

	out, errOut, code := plugin(t.Context(), "", "-n", ns, "workspace", "snapshot", "snap")
	if code != 0 || !strings.Contains(out, "snapshot of") {
		t.Fatalf("workspace snapshot: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	out, errOut, code = plugin(t.Context(), "", "-n", ns, "workspace", "suspend", "snap")
	if code != 0 || !strings.Contains(out, "suspended") {
		t.Fatalf("workspace suspend: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	out, _, _ = plugin(t.Context(), "", "-n", ns, "workspace", "get", "snap")
	if !strings.Contains(out, "Suspended") || !strings.Contains(out, "ago") {
		t.Errorf("workspace get of a suspended workspace:\n%s", out)
	}

	start := time.Now()
	out, errOut, code = plugin(t.Context(), "", "-n", ns, "workspace", "resume", "snap")
	if code != 0 || !strings.Contains(out, "ready on") {
		t.Fatalf("workspace resume: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	got := run(`sha256sum data; cat src/a; readlink src/link; ls -d src/empty`)
	t.Logf("resume of a 100 MiB workspace until its first task ended: %v", time.Since(start).Round(time.Millisecond))
	if want := sum + "hi\na\nsrc/empty\n"; got != want {
		t.Errorf("after the resume:\n%s\nwant:\n%s", got, want)
	}
}
