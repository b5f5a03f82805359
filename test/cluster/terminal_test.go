package cluster

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	bashtaskclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
)

// TestTerminalInImageWorkspace: a task with spec.tty in a workspace of the
// Task image (Debian, its own terminfo) through the chart's output API:
// the Go client's Attach sets a window size, and `tput cols` and `tput
// lines` of the image read it from the terminal the shim made inside the
// image's root.
func TestTerminalInImageWorkspace(t *testing.T) {
	ns := newNamespace(t)
	ws := newImageWorkspace(t, ns, "term", taskRef)
	waitWorkspaceUntil(t, ws, "Ready", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceReady
	})
	bt := &v1.BashTask{}
	bt.Namespace, bt.Name = ns, "tput"
	bt.Spec.Command, bt.Spec.Workspace, bt.Spec.TTY = `while read -r _; do echo "size=$(tput cols)x$(tput lines)"; done`, ptr.To(ws.Name), ptr.To(true)
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	oc, err := bashtaskclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	out := &syncbuf.Buffer{}
	sizes := make(chan bashtaskclient.WindowSize, 1)
	sizes <- bashtaskclient.WindowSize{Width: 123, Height: 45}
	done := make(chan error, 1)
	go func() {
		done <- oc.Attach(ctx, ns, bt.Name, bashtaskclient.AttachOptions{Stdin: pr, Stdout: out, Sizes: sizeQueue(sizes)})
	}()
	// Each Enter prints the size the terminal has then: the first may
	// come before the window size does.
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(out.String(), "size=123x45"); {
		if _, err := pw.Write([]byte("\r")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("attach ended (%v) before tput printed size=123x45:\n%q", err, out.String())
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("tput did not print size=123x45 in 2 minutes:\n%q", out.String())
		}
	}
}

// sizeQueue hands out the window sizes sent on c
// (remotecommand.TerminalSizeQueue).
type sizeQueue chan bashtaskclient.WindowSize

func (q sizeQueue) Next() *bashtaskclient.WindowSize {
	s, ok := <-q
	if !ok {
		return nil
	}
	return &s
}
