package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// imageApplets are the BusyBox applets of the image of
// TestImageWorkspaceTenantRules.
var imageApplets = []string{"sh", "cat", "id", "awk", "stat", "sort", "tr", "test", "echo", "grep"}

// imageRulesCommand prints, one name=value a line, what a task sees of
// the tenant rules in its image; the paths in nodePaths are the node's,
// outside the image.
func imageRulesCommand(nodePaths ...string) string {
	lines := []string{
		`echo uid=$(id -u) task=$(id -u task)`,
		`echo euid=$(/bin/suid-bash -p -c 'echo $EUID')`,
		`echo procuids=$(stat -c %u /proc/[0-9]* 2>/dev/null | sort -u | tr '\n' ' ')`,
		`echo kept > /etc/e2e-kept && echo etcwrite=ok`,
	}
	for i, p := range nodePaths {
		lines = append(lines, fmt.Sprintf(`test -e %q && echo node%d=visible || echo node%d=absent`, p, i, i))
	}
	return strings.Join(lines, "\n")
}

// TestImageWorkspaceTenantRules runs a workspace of a static bash and
// BusyBox image, pushed to a registry on the loopback, through the
// controller and the agent processes: the workspace records the tag's
// digest, and its task runs as the workspace's UID (the task user of the
// image's /etc/passwd, not 0), a set-user-ID root bash of the image
// raises nothing, /proc shows only the task's own processes, the agent's
// files on the node are absent, and a file the task writes under /etc is
// there for the next task. The executor's tests check each rule on an
// executor alone (executor/root_linux_test.go); this one the wiring of
// spec.image to the agents' image store and the task's root.
func TestImageWorkspaceTenantRules(t *testing.T) {
	needWorkspaces(t)
	reg := registry.StartForTest(t)
	img := registry.BusyboxImage{Applets: imageApplets, SetUIDBash: []string{"bin/suid-bash"}}.BuildForTest(t)
	byDigest := registry.PushForTest(t, reg, img, "e2e/task-small", "1")
	ns := newNamespace(t)
	ws := createWorkspace(t, ns, "img1", "--image", reg.Ref("e2e/task-small", "1"), "--network", "None")
	if ws.Status.Image == nil || !strings.HasSuffix(byDigest, "@"+ptr.Deref(ws.Status.Image.Digest, "")) {
		t.Fatalf("the workspace's status.image is %+v, want the digest of %s", ws.Status.Image, byDigest)
	}
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "img1", "--", cmd)
		if code != 0 {
			t.Fatalf("task %q: exit %d\nstdout: %s\nstderr: %s", cmd, code, out, errOut)
		}
		return out
	}
	// The agent's binary and the repository: on the node, outside /tmp
	// (which a task has its own of anyway).
	out := run(imageRulesCommand(filepath.Join(binDir, "bashtask-agent"), filepath.Join(root, "go.mod")))
	uid := strconv.FormatInt(ptr.Deref(ws.Status.RunAsUser, 0), 10)
	for _, want := range []string{
		"uid=" + uid + " task=" + uid + "\n",
		"euid=" + uid + "\n",
		"procuids=" + uid + "\n",
		"etcwrite=ok\n",
		"node0=absent\n",
		"node1=absent\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the task in the image printed no %q:\n%s", want, out)
		}
	}
	if uid == "0" {
		t.Errorf("the workspace's tasks run as uid 0")
	}
	if got := run(`cat /etc/e2e-kept`); got != "kept\n" {
		t.Errorf("the next task reads /etc/e2e-kept as %q, want the first task's \"kept\\n\"", got)
	}
}
