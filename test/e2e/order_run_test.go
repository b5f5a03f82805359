package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// interleaved writes three lines to each stream by turns, with pauses
// long enough that the agent reads each before the next (docs/output.md:
// writes closer together may be read in either order).
const interleaved = `for i in 1 2 3; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done`

const interleavedOrder = "out1\nerr1\nout2\nerr2\nout3\nerr3\n"

// The client's Run and the plugin's run write stdout and stderr in the
// order the agent read them: with both writers on one buffer (or both of
// run's outputs on one pipe) the lines come back interleaved as written,
// and each stream alone is still whole.
func TestRunKeepsTheOrderOfStdoutAndStderr(t *testing.T) {
	ns := newNamespace(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	c := outputClient(t, adminConfig(t))
	var both syncbuf.Buffer
	res, err := c.Run(ctx, client.RunOptions{Namespace: ns, Command: interleaved, Stdout: &both, Stderr: &both, WaitTimeout: time.Minute})
	if err != nil || res.ExitCode != 0 || both.String() != interleavedOrder {
		t.Errorf("client Run on one buffer: %q, %v; want %q", both.String(), err, interleavedOrder)
	}

	// Ended before its output is read: both tails hold their stream whole,
	// and only the combined stream has their order.
	task, err := c.Start(ctx, client.RunOptions{Namespace: ns, Command: interleaved})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitTerminal(t, k8s, ns, []string{task.Name}, time.Minute)
	var after syncbuf.Buffer
	res, err = c.Wait(ctx, task, client.RunOptions{Stdout: &after, Stderr: &after})
	if err != nil || res.ExitCode != 0 || after.String() != interleavedOrder {
		t.Errorf("client Wait of an ended task on one buffer: %q, %v; want %q", after.String(), err, interleavedOrder)
	}

	var pipe bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-bashtask"), "--kubeconfig", filepath.Join(clusterDir, "kubeconfig"),
		"-n", ns, "run", "--", interleaved)
	cmd.Stdout, cmd.Stderr = &pipe, &pipe
	if err := cmd.Run(); err != nil || pipe.String() != interleavedOrder {
		t.Errorf("kubectl bashtask run on one pipe: %q, %v; want %q", pipe.String(), err, interleavedOrder)
	}
	out, errOut, code := plugin(ctx, "", "-n", ns, "run", "--", interleaved)
	if code != 0 || out != "out1\nout2\nout3\n" || errOut != "err1\nerr2\nerr3\n" {
		t.Errorf("kubectl bashtask run apart: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
