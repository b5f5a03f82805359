package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// TestPluginLogsPastSpillLimit: logs --full of a stream longer than its
// spill limit and its tail together writes the bytes the agent kept and
// exits 1 naming the offset where they end, never 0 with a short file;
// --tail-ok adds the tail after a note and exits 0.
func TestPluginLogsPastSpillLimit(t *testing.T) {
	ns := newNamespace(t)
	const limit, size = 150000, 400000
	bt := createTask(t, ns, "spill", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x`, size), func(bt *v1.BashTask) {
		bt.Spec.Output = &v1.OutputSpec{SpillLimitBytes: ptr.To(int64(limit))}
	})
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	tail := ptr.Deref(done.Status.Stdout.Tail, "")
	out, errOut, code := plugin(t.Context(), "", "-n", ns, "logs", "--full", bt.Name)
	want := fmt.Sprintf("stdout: bytes %d to %d of %d cannot be read: ", limit, size-len(tail), size)
	if code != 1 || out != strings.Repeat("x", limit) || !strings.Contains(errOut, want) || !strings.Contains(errOut, fmt.Sprintf("offset %d", limit)) {
		t.Errorf("logs --full: exit %d, %d bytes, stderr %q; want 1, the first %d bytes and %q naming offset %d", code, len(out), errOut, limit, want, limit)
	}
	out, errOut, code = plugin(t.Context(), "", "-n", ns, "logs", "--full", "--tail-ok", bt.Name)
	if code != 0 || out != strings.Repeat("x", limit)+tail || !strings.Contains(errOut, "the last 64000 bytes kept in status follow") {
		t.Errorf("logs --full --tail-ok: exit %d, %d bytes, stderr %q; want 0, %d bytes and a note", code, len(out), errOut, limit+len(tail))
	}
}

// TestPluginReaderNeedsOnlyRBAC: a user who may get bashtasks and
// bashtasks/log of output.bashtask.dev reads a task's whole output with
// the plugin, without bucket credentials; one without bashtasks/log gets
// exit 1 and a message naming the permission.
func TestPluginReaderNeedsOnlyRBAC(t *testing.T) {
	ns := newNamespace(t)
	bt := createTask(t, ns, "big", `seq 1 100000`)
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	grant := func(user string, rules ...rbacv1.PolicyRule) {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: rules}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		for _, o := range []ctrlclient.Object{role, rb} {
			if err := k8s.Create(t.Context(), o); err != nil {
				t.Fatal(err)
			}
		}
	}
	getTasks := rbacv1.PolicyRule{APIGroups: []string{"bashtask.dev"}, Resources: []string{"bashtasks"}, Verbs: []string{"get", "list", "watch"}}
	getLog := rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/log"}, Verbs: []string{"get"}}
	grant("e2e-plugin-reader", getTasks, getLog)
	grant("e2e-plugin-no-log", getTasks)
	want := ptr.Deref(done.Status.Stdout.SHA256, "")
	// RBAC reaches the authorizers' caches within a moment.
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "--as", "e2e-plugin-reader", "logs", bt.Name)
		if code == 0 && sha([]byte(out)) == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs as a user with get on bashtasks/log: exit %d, %d bytes, stderr %q", code, len(out), errOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, errOut, code := plugin(t.Context(), "", "-n", ns, "--as", "e2e-plugin-no-log", "logs", bt.Name)
	if code != 1 || out != "" || !strings.Contains(errOut, "reading output takes get on bashtasks/log in the API group output.bashtask.dev") {
		t.Errorf("logs as a user without bashtasks/log: exit %d, %d bytes, stderr %q; want 1 and the permission named", code, len(out), errOut)
	}
}

// arrival is one line of a plugin's stdout and when it arrived.
type arrival struct {
	line string
	at   time.Time
}

// runArrivals runs `kubectl bashtask run -- command` and records when
// each line of its stdout arrives.
func runArrivals(t *testing.T, ns, command string) []arrival {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-bashtask"), "--kubeconfig", filepath.Join(clusterDir, "kubeconfig"), "-n", ns, "run", "--", command)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var got []arrival
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			got = append(got, arrival{line: strings.TrimSuffix(line, "\n"), at: time.Now()})
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run -- %s: %v, stderr %q", command, err, errOut.String())
	}
	return got
}

// TestPluginRunPrintsEachLineAsWritten measures `run` of a command that
// writes a line a second: the lines arrive a second apart, each as the
// command writes it, not in bunches as status updates would bring them.
// The target is 0.5 s from the write to the local stdout; the assertions
// allow 0.9 s for a busy machine, and the figures are logged.
func TestPluginRunPrintsEachLineAsWritten(t *testing.T) {
	ns := newNamespace(t)
	const tolerance = 900 * time.Millisecond

	// The demo's command: the spacing of the arrivals.
	got := runArrivals(t, ns, `for i in 1 2 3 4 5 6; do echo line $i; sleep 1; done`)
	var lines []string
	for _, a := range got {
		lines = append(lines, a.line)
	}
	if want := []string{"line 1", "line 2", "line 3", "line 4", "line 5", "line 6"}; !slices.Equal(lines, want) {
		t.Fatalf("run printed %q, want %q", lines, want)
	}
	var spacing []string
	for i := 1; i < len(got); i++ {
		gap := got[i].at.Sub(got[i-1].at)
		late := gap - time.Second
		spacing = append(spacing, fmt.Sprintf("%s %+dms", got[i].line, late.Milliseconds()))
		if late > tolerance || late < -tolerance {
			t.Errorf("%s arrived %s after %s, want 1s +- %s", got[i].line, gap, got[i-1].line, tolerance)
		}
	}
	t.Logf("arrival after the previous line + 1s: %s", strings.Join(spacing, ", "))

	// The same with the time of each write: the delay from the write to
	// the local stdout, on one host's clock.
	got = runArrivals(t, ns, `for i in 1 2 3 4 5 6; do echo "line $i $(date +%s.%N)"; sleep 1; done`)
	if len(got) != 6 {
		t.Fatalf("run printed %d lines, want 6: %+v", len(got), got)
	}
	var delays []string
	var worst time.Duration
	for _, a := range got {
		f := strings.Fields(a.line)
		sec, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("line %q: %v", a.line, err)
		}
		written := time.Unix(0, int64(sec*1e9))
		delay := a.at.Sub(written)
		worst = max(worst, delay)
		delays = append(delays, fmt.Sprintf("%s %dms", strings.Join(f[:2], " "), delay.Milliseconds()))
		if delay > tolerance {
			t.Errorf("%s reached the local stdout %s after it was written, want at most %s", strings.Join(f[:2], " "), delay, tolerance)
		}
	}
	t.Logf("write to local stdout: %s (worst %dms; target 500ms)", strings.Join(delays, ", "), worst.Milliseconds())
}

// TestPluginLogsStreamAll: logs --stream all writes stdout's bytes to
// stdout and stderr's to stderr in the order the command wrote them: with
// both on one pipe they interleave as the command's did; apart, each is
// its stream.
func TestPluginLogsStreamAll(t *testing.T) {
	ns := newNamespace(t)
	bt := createTask(t, ns, "all", `for i in 1 2 3; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done`)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Followed while it runs, and again once it has ended.
	for i, args := range [][]string{{"-f"}, {"--full"}} {
		if i == 1 {
			testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)
		}
		var both bytes.Buffer
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-bashtask"), append([]string{"--kubeconfig", filepath.Join(clusterDir, "kubeconfig"),
			"-n", ns, "logs", "--stream", "all", bt.Name}, args...)...)
		cmd.Stdout, cmd.Stderr = &both, &both
		err := cmd.Run()
		if want := "out1\nerr1\nout2\nerr2\nout3\nerr3\n"; err != nil || both.String() != want {
			t.Errorf("logs --stream all %v on one pipe: %q, %v; want %q", args, both.String(), err, want)
		}
	}
	out, errOut, code := plugin(ctx, "", "-n", ns, "logs", "--stream", "all", bt.Name)
	if code != 0 || out != "out1\nout2\nout3\n" || errOut != "err1\nerr2\nerr3\n" {
		t.Errorf("logs --stream all apart: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
