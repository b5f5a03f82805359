//go:build linux

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// The images of docs/images.md on a real cluster: the agent in its pod
// pulls from the in-cluster registry (internal/rig/nodecluster, a
// Service's ClusterIP, plain HTTP) and runs the tasks in the image.

// TestWorkspaceInImage: a BashWorkspace naming task-small in the
// in-cluster registry becomes Ready with the pushed digest in
// status.image.digest and ImagePulled True; its tasks run in the image
// (BusyBox is there, python3 is not), and a file a task writes under /etc
// is there for the next task.
func TestWorkspaceInImage(t *testing.T) {
	ns := newNamespace(t)
	ws := newImageWorkspace(t, ns, "small", taskSmallRef)
	got := waitWorkspaceUntil(t, ws, "Ready", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceReady
	})
	if im := got.Status.Image; im == nil || ptr.Deref(im.Digest, "") != digests[taskSmallRef] || ptr.Deref(im.Requested, "") != taskSmallRef {
		t.Errorf("status.image = %s, want %s resolved to %s", dump.OneLine(got.Status.Image), taskSmallRef, digests[taskSmallRef])
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionImagePulled); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition ImagePulled = %s, want True", dump.OneLine(c))
	}
	first := runInWorkspace(t, ns, "first", ws.Name,
		`test -x /bin/busybox && echo busybox; command -v python3 || echo no-python3; echo kept > /etc/bashtask-marker`)
	if out := ptr.Deref(first.Status.Stdout.Tail, ""); out != "busybox\nno-python3\n" {
		t.Errorf("the first task's stdout is %q, want BusyBox and no python3 (the task-small image)", out)
	}
	second := runInWorkspace(t, ns, "second", ws.Name, `cat /etc/bashtask-marker`)
	if out := ptr.Deref(second.Status.Stdout.Tail, ""); out != "kept\n" {
		t.Errorf("the second task's stdout is %q, want the file the first wrote under /etc", out)
	}
}

// TestPrivateImagePullSecret: a repository that wants credentials is
// pulled with the workspace's spec.imagePullSecrets; without them the
// workspace fails ImageUnauthorized.
func TestPrivateImagePullSecret(t *testing.T) {
	ns := newNamespace(t)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-credentials"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: registry.TestDockerConfigJSON(registryHost)},
	}
	if err := k8s.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	with := newImageWorkspace(t, ns, "with-secret", privateRef, secret.Name)
	without := newImageWorkspace(t, ns, "without-secret", privateRef)
	got := waitWorkspaceUntil(t, with, "Ready", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceReady
	})
	if im := got.Status.Image; im == nil || ptr.Deref(im.Digest, "") != digests[privateRef] {
		t.Errorf("status.image = %s, want the digest %s", dump.OneLine(got.Status.Image), digests[privateRef])
	}
	failed := waitWorkspaceUntil(t, without, "Failed", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceFailed
	})
	if c := meta.FindStatusCondition(failed.Status.Conditions, v1.ConditionReady); c == nil || c.Reason != string(v1.ReasonImageUnauthorized) {
		t.Errorf("condition Ready = %s, want reason %s", dump.OneLine(c), v1.ReasonImageUnauthorized)
	}
}

// TestDefaultImagePython: a task that names no image runs in the chart's
// default image (agent.images.defaultImage, here the in-cluster copy of
// the Task image), so the docs' python3 examples work on the defaults.
func TestDefaultImagePython(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "python", `python3 -c 'print(6*7)'`)
	bt := testutil.WaitTerminal(t, k8s, ns, []string{"python"}, 2*time.Minute)["python"]
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded || bt.Status.Stdout == nil || ptr.Deref(bt.Status.Stdout.Tail, "") != "42\n" {
		t.Fatalf("%s, stdout %s", describe(bt), dump.OneLine(bt.Status.Stdout))
	}
	if im := bt.Status.Image; im == nil || ptr.Deref(im.Requested, "") != taskRef || ptr.Deref(im.Digest, "") != digests[taskRef] {
		t.Errorf("status.image = %s, want %s resolved to %s", dump.OneLine(bt.Status.Image), taskRef, digests[taskRef])
	}
}

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
