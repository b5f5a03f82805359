//go:build linux

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// newImageWorkspace creates a workspace in image ref with the pull
// secrets, deleted when the test ends.
func newImageWorkspace(t *testing.T, ns, name, ref string, secrets ...string) *v1.BashWorkspace {
	t.Helper()
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	ws.Spec.Image = ptr.To(v1.ImageReference(ref))
	for _, s := range secrets {
		ws.Spec.ImagePullSecrets = append(ws.Spec.ImagePullSecrets, v1.ImagePullSecret{Name: s})
	}
	if err := k8s.Create(t.Context(), ws); err != nil {
		t.Fatalf("creating workspace %s: %v", name, err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ws) })
	return ws
}

// waitWorkspaceUntil polls the workspace until ok returns true for it.
func waitWorkspaceUntil(t *testing.T, ws *v1.BashWorkspace, what string, timeout time.Duration, ok func(*v1.BashWorkspace) bool) *v1.BashWorkspace {
	t.Helper()
	var got *v1.BashWorkspace
	testutil.WaitFor(t, fmt.Sprintf("workspace %s/%s %s", ws.Namespace, ws.Name, what), timeout, func() error {
		w := &v1.BashWorkspace{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(ws), w); err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if !ok(w) {
			return fmt.Errorf("status %s", dump.OneLine(w.Status))
		}
		got = w
		return nil
	})
	return got
}

// runInWorkspace runs command as a task of the workspace and returns it
// once it succeeded; any other end fails the test.
func runInWorkspace(t *testing.T, ns, name, workspace, command string) *v1.BashTask {
	t.Helper()
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	bt.Spec.Command, bt.Spec.Workspace = command, ptr.To(workspace)
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatalf("creating task %s: %v", name, err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{name}, 2*time.Minute)[name]
	if ptr.Deref(done.Status.Reason, "") != v1.ReasonSucceeded || done.Status.Stdout == nil {
		t.Fatalf("%s, stdout %s, stderr %s", describe(done), dump.OneLine(done.Status.Stdout), dump.OneLine(done.Status.Stderr))
	}
	return done
}

// digestOf is the digest of a reference by digest (REPO@sha256:...).
func digestOf(ref string) string {
	_, d, _ := strings.Cut(ref, "@")
	return d
}
