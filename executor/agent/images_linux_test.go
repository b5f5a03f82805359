//go:build linux

package agent

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"

	rigregistry "github.com/bashtask/bashtask-operator/internal/rig/registry"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// imageApplets are the busybox applets of a test image.
var imageApplets = []string{"sh", "cat", "ls", "id", "echo", "rm", "cp", "test", "true", "mkdir", "touch", "stat", "grep"}

// testRegistry is go-containerregistry's in-process registry on
// loopback; repositories under private/ want basic authentication.
type testRegistry struct {
	host string
	// down makes the repositories under flaky/ answer 503.
	down atomic.Bool
}

func newImageRegistry(t *testing.T) *testRegistry {
	t.Helper()
	reg := rigregistry.GuardPrivateForTest(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	tr := &testRegistry{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/flaky/") && tr.down.Load() {
			http.Error(w, "registry down for maintenance", http.StatusServiceUnavailable)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tr.host = strings.TrimPrefix(srv.URL, "http://")
	return tr
}

// pullSecret is the .dockerconfigjson of the registry's credentials.
func (r *testRegistry) pullSecret() []byte {
	return rigregistry.TestDockerConfigJSON(r.host)
}

// push builds an image of one layer for linux and arch (bash unless
// withBash is false, busybox, /etc/os-release naming it, /etc/gone) and
// pushes it as repoTag; it returns the reference and its digest.
func (r *testRegistry) push(t *testing.T, repoTag, arch string, withBash bool) (string, string) {
	t.Helper()
	img := rigregistry.BusyboxImage{
		Arch: arch, NoBash: !withBash, Applets: imageApplets,
		Dirs:  []string{"usr/", "usr/local/", "usr/local/bin/"},
		Files: map[string]string{"etc/os-release": "ID=" + repoTag + "\n", "etc/gone": "an image file a task deletes\n"},
	}.BuildForTest(t)
	return r.pushImage(t, repoTag, img)
}

// pushImage pushes img as repoTag; it returns the reference and the
// image's digest.
func (r *testRegistry) pushImage(t *testing.T, repoTag string, img v1.Image) (string, string) {
	t.Helper()
	ref := r.host + "/" + repoTag
	nr, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	kc := authn.NewMultiKeychain(staticKeychain{authn.FromConfig(authn.AuthConfig{Username: rigregistry.TestUser, Password: rigregistry.TestPassword})})
	if err := remote.Write(nr, img, remote.WithAuthFromKeychain(kc)); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ref, d.String()
}

// imageBytes is the size of the test image's two big files.
func imageBytes(t *testing.T) int64 {
	var n int64
	for _, p := range []string{nodeimages.HostBashStatic, nodeimages.HostBusybox} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// staticKeychain answers every registry with one authenticator.
type staticKeychain struct{ a authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.a, nil }

// withImages configures the rig's agent for the registry.
func withImages(reg *testRegistry, f func(*ImageConfig)) rigOption {
	return func(c *Config) {
		c.Images.PlainHTTP = []string{reg.host}
		c.Images.RetryInitial, c.Images.RetryMax = 50*time.Millisecond, 500*time.Millisecond
		if f != nil {
			f(&c.Images)
		}
	}
}

// ensureImage calls EnsureWorkspace until it answers with a status or an
// image failure; the first answer must be image_pull when pull is set.
func ensureImage(t *testing.T, wc agentv1.WorkspacesClient, spec *agentv1.WorkspaceSpec, pull bool) *agentv1.EnsureWorkspaceResponse {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for i := 0; ; i++ {
		resp, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: spec})
		if err != nil {
			t.Fatalf("EnsureWorkspace %s: %v", spec.GetRef().GetUid(), err)
		}
		if i == 0 && pull && resp.GetImagePull() == nil {
			t.Fatalf("the first EnsureWorkspace of an image not on the node answered %v, want image_pull", resp)
		}
		if resp.GetStatus() != nil || resp.GetImageFailure() != nil {
			return resp
		}
		if resp.GetImagePull().GetReference() == "" {
			t.Fatalf("image_pull without its reference: %v", resp)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the image did not arrive: %v", resp)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startImage calls Start until it answers with a status or an image
// failure; the first answer must be image_pull when pull is set.
func (r *rig) startImage(spec *agentv1.TaskSpec, pull bool) *agentv1.StartResponse {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for i := 0; ; i++ {
		resp, err := r.client.Start(r.t.Context(), &agentv1.StartRequest{Spec: spec})
		if err != nil {
			r.t.Fatalf("Start %s: %v", spec.GetRef().GetUid(), err)
		}
		if i == 0 && pull && resp.GetImagePull() == nil {
			r.t.Fatalf("the first Start of an image not on the node answered %v, want image_pull", resp)
		}
		if resp.GetStatus() != nil || resp.GetImageFailure() != nil {
			return resp
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the image did not arrive: %v", resp)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// imageTask is task uid running command in image (nil: none named).
func imageTask(uid, command string, image *agentv1.ImageSpec) *agentv1.TaskSpec {
	s := taskSpec(uid, command)
	s.Image = image
	return s
}

// wsSpec is workspace uid's spec with image.
func wsSpec(uid string, epoch int64, image *agentv1.ImageSpec) *agentv1.WorkspaceSpec {
	return &agentv1.WorkspaceSpec{Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + uid, Uid: uid, Epoch: epoch}, Network: "None", Image: image}
}

// A workspace in an image: EnsureWorkspace answers image_pull, then
// makes it; its tasks' changes to /etc and /usr/local/bin and a deleted
// image file last to the next task, go into a snapshot and come back in
// a restore on a second agent, in the same digest; the image is
// immutable.
func TestImageWorkspacePersistsAndRestores(t *testing.T) {
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "tools/bash:1", runtime.GOARCH, true)
	bucket := t.TempDir()
	a := newRig(t, tenantLevel(2101500, 2101509), withBucket(bucket), withImages(reg, nil))
	wa := a.workspaceClient()
	resp := ensureImage(t, wa, wsSpec("i1", 1, &agentv1.ImageSpec{Reference: ref}), true)
	if im := resp.GetStatus().GetImage(); im.GetReference() != ref || im.GetDigest() != digest || !im.GetPulled() {
		t.Fatalf("workspace image %v, want %s at %s, pulled", im, ref, digest)
	}
	task := func(uid, cmd string, epoch int64) *agentv1.TaskSpec {
		s := wsTask(uid, "i1", cmd)
		s.Workspace.Epoch = epoch
		return s
	}
	res := a.runTask(task("t1", `echo persisted > /etc/motd && cp /bin/busybox /usr/local/bin/echo && rm /etc/gone && echo home > "$HOME/h"`, 1))
	if res.GetReason() != "Succeeded" || res.GetImage().GetDigest() != digest {
		t.Fatalf("t1: %s %s %q image %v", res.GetReason(), res.GetMessage(), res.GetStderr().GetTail(), res.GetImage())
	}
	check := `cat /etc/motd; /usr/local/bin/echo tool; test -e /etc/gone && echo gone=present || echo gone=absent; cat "$HOME/h"; cat /etc/os-release`
	want := "persisted\ntool\ngone=absent\nhome\nID=tools/bash:1\n"
	if res := a.runTask(task("t2", check, 1)); res.GetStdout().GetTail() != want {
		t.Errorf("t2 in the same workspace: %s %s %q, want %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), want)
	}
	if _, err := wa.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: wsSpec("i1", 1, &agentv1.ImageSpec{Reference: reg.host + "/tools/other:1"})}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), ref) || !strings.Contains(err.Error(), "tools/other:1") {
		t.Errorf("Ensure with another image: %v, want FAILED_PRECONDITION naming both", err)
	}
	snap, err := wa.SnapshotWorkspace(t.Context(), &agentv1.SnapshotWorkspaceRequest{Uid: "i1"})
	if err != nil {
		t.Fatal(err)
	}

	b := newRig(t, tenantLevel(2101510, 2101519), withBucket(bucket), withImages(reg, nil))
	spec := wsSpec("i1", 2, &agentv1.ImageSpec{Reference: ref, Digest: digest})
	spec.RestoreFrom = snap.GetSnapshot()
	resp = ensureImage(t, b.workspaceClient(), spec, true)
	if im := resp.GetStatus().GetImage(); im.GetDigest() != digest {
		t.Fatalf("restored workspace image %v (%v), want digest %s", im, resp, digest)
	}
	if res := b.runTask(task("t3", check, 2)); res.GetStdout().GetTail() != want {
		t.Errorf("t3 in the restored workspace: %s %s %q, want %q (stderr %q)", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), want, res.GetStderr().GetTail())
	}
}

// A task without a workspace in an image: Start answers image_pull,
// then runs it; its changes go with it, and the work root keeps nothing
// of its upper directory. An image without bash ends the task
// ImageShellMissing naming the image.
func TestImageTaskWithoutWorkspace(t *testing.T) {
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "tools/bash:1", runtime.GOARCH, true)
	noBash, _ := reg.push(t, "tools/busybox:1", runtime.GOARCH, false)
	r := newRig(t, tenantLevel(2101520, 2101529), withImages(reg, nil))
	began := time.Now()
	resp := r.startImage(imageTask("t1", `echo changed > /etc/os-release; cat /etc/os-release`, &agentv1.ImageSpec{Reference: ref}), true)
	t.Logf("the first Start of an image of %d bytes (bash-static and busybox) to its task's start: %v", imageBytes(t), time.Since(began).Round(time.Millisecond))
	if resp.GetStatus().GetImage().GetDigest() != digest {
		t.Errorf("the running task's image %v, want digest %s", resp.GetStatus().GetImage(), digest)
	}
	res := r.finished("t1")
	if res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != "changed\n" || res.GetImage().GetReference() != ref {
		t.Fatalf("t1: %s %s %q image %v", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), res.GetImage())
	}
	// The image is on the node now: the next Start runs at once, in the
	// image as it was.
	resp = r.startImage(imageTask("t2", `cat /etc/os-release`, &agentv1.ImageSpec{Reference: ref}), false)
	if resp.GetStatus() == nil {
		t.Fatalf("t2: %v, want a started task", resp)
	}
	if res := r.finished("t2"); res.GetStdout().GetTail() != "ID=tools/bash:1\n" {
		t.Errorf("t2 sees %q (%s %s): t1's change outlived it", res.GetStdout().GetTail(), res.GetReason(), res.GetMessage())
	}
	if left, _ := filepath.Glob(filepath.Join(r.dir, "bashtask-root-*")); len(left) != 0 {
		t.Errorf("upper directories left in the work root: %v", left)
	}
	r.startImage(imageTask("t3", `echo ran`, &agentv1.ImageSpec{Reference: noBash}), true)
	if res := r.finished("t3"); res.GetReason() != "ImageShellMissing" || !strings.Contains(res.GetMessage(), noBash) || !strings.Contains(res.GetMessage(), "bash") {
		t.Errorf("an image without bash: %s %q, want ImageShellMissing naming the image and the shell", res.GetReason(), res.GetMessage())
	}
}

// Each pull failing for good answers image_failure with the API's
// reason and a message naming the reference, and is remembered.
func TestImageFailures(t *testing.T) {
	reg := newImageRegistry(t)
	private, _ := reg.push(t, "private/bash:1", runtime.GOARCH, true)
	other := "s390x"
	if runtime.GOARCH == other {
		other = "amd64"
	}
	foreign, _ := reg.push(t, "tools/foreign:1", other, true)
	large, _ := reg.push(t, "tools/large:1", runtime.GOARCH, true)
	r := newRig(t, tenantLevel(2101530, 2101539), withImages(reg, func(c *ImageConfig) { c.CacheBytes = 1 << 20 }))
	for i, c := range []struct{ ref, reason string }{
		{reg.host + "/tools/missing:1", "ImageNotFound"},
		{private, "ImageUnauthorized"},
		{foreign, "ImageUnsupported"},
		{large, "ImageTooLarge"},
	} {
		uid := fmt.Sprintf("f%d", i)
		f := r.startImage(imageTask(uid, "true", &agentv1.ImageSpec{Reference: c.ref}), true).GetImageFailure()
		if f.GetReason() != c.reason || !strings.Contains(f.GetMessage(), c.ref) {
			t.Errorf("%s: failure %v, want %s naming the reference", c.ref, f, c.reason)
		}
		// Remembered: the same answer at once, nothing started.
		again, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: imageTask(uid, "true", &agentv1.ImageSpec{Reference: c.ref})})
		if err != nil || again.GetImageFailure().GetReason() != c.reason || again.GetStatus() != nil {
			t.Errorf("%s again: %v %v", c.ref, again, err)
		}
		w := ensureImage(t, r.workspaceClient(), wsSpec(uid, 1, &agentv1.ImageSpec{Reference: c.ref}), false)
		if w.GetImageFailure().GetReason() != c.reason || w.GetStatus() != nil {
			t.Errorf("%s for a workspace: %v", c.ref, w)
		}
	}
}

// A private image pulled with one request's credentials is not handed
// to a request without them, although the store serves it by digest
// without a registry: the registry is asked with the second request's
// credentials, and refuses.
func TestImageCredentialsNotShared(t *testing.T) {
	reg := newImageRegistry(t)
	private, digest := reg.push(t, "private/bash:1", runtime.GOARCH, true)
	r := newRig(t, tenantLevel(2101540, 2101549), withImages(reg, nil))
	byDigest := &agentv1.ImageSpec{Reference: private, Digest: digest}
	withSecret := &agentv1.ImageSpec{Reference: private, Digest: digest, PullSecrets: [][]byte{reg.pullSecret()}}
	r.startImage(imageTask("c1", `cat /etc/os-release`, withSecret), true)
	if res := r.finished("c1"); res.GetReason() != "Succeeded" {
		t.Fatalf("c1 with the secret: %s %s", res.GetReason(), res.GetMessage())
	}
	resp := r.startImage(imageTask("c2", `cat /etc/os-release`, byDigest), false)
	if f := resp.GetImageFailure(); f.GetReason() != "ImageUnauthorized" || resp.GetStatus() != nil {
		t.Errorf("c2 without the secret: %v, want ImageUnauthorized and nothing started", resp)
	}
	w := ensureImage(t, r.workspaceClient(), wsSpec("c3", 1, byDigest), false)
	if w.GetImageFailure().GetReason() != "ImageUnauthorized" {
		t.Errorf("a workspace without the secret: %v, want ImageUnauthorized", w)
	}
	// The same credentials again: served from the store.
	if resp := r.startImage(imageTask("c4", `true`, withSecret), false); resp.GetStatus() == nil {
		t.Errorf("c4 with the secret: %v, want a started task", resp)
	}
	r.finished("c4")
}

// The agent's --default-image applies to a request naming none; node_root
// keeps the node's root file system. The readiness names the "images"
// capability.
func TestImageDefault(t *testing.T) {
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "tools/default:1", runtime.GOARCH, true)
	r := newRig(t, tenantLevel(2101550, 2101559), withImages(reg, func(c *ImageConfig) { c.DefaultImage = ref }))
	if info, _ := r.watch(); !slices.Contains(info.GetReadiness().GetCapabilities(), "images") {
		t.Errorf("capabilities %v lack images at the tenant level", info.GetReadiness().GetCapabilities())
	}
	r.startImage(imageTask("d1", `cat /etc/os-release`, nil), true)
	if res := r.finished("d1"); res.GetStdout().GetTail() != "ID=tools/default:1\n" || res.GetImage().GetDigest() != digest || res.GetImage().GetReference() != ref {
		t.Errorf("without an image: %q image %v (%s %s), want the default", res.GetStdout().GetTail(), res.GetImage(), res.GetReason(), res.GetMessage())
	}
	resp := r.startImage(imageTask("d2", `cat /etc/os-release`, &agentv1.ImageSpec{NodeRoot: true}), false)
	if resp.GetStatus() == nil {
		t.Fatalf("node_root: %v", resp)
	}
	if res := r.finished("d2"); strings.Contains(res.GetStdout().GetTail(), "tools/default") || res.GetImage() != nil {
		t.Errorf("node_root: %q image %v, want the node's root", res.GetStdout().GetTail(), res.GetImage())
	}
}

// A restarted agent holds its workspaces' images from the store's
// opening on: with a budget the image no longer fits, it is kept, not
// evicted, and the workspace's tasks run in it.
func TestImageWorkspaceKeptOverRestart(t *testing.T) {
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "tools/bash:1", runtime.GOARCH, true)
	r := newRig(t, tenantLevel(2101560, 2101569), withImages(reg, nil))
	ensureImage(t, r.workspaceClient(), wsSpec("k1", 1, &agentv1.ImageSpec{Reference: ref}), true)
	if err := r.shutdown(); err != nil {
		t.Fatal(err)
	}
	r.srv.ws.closeAll()
	if err := r.srv.images.close(); err != nil {
		t.Fatal(err)
	}

	r2 := newRig(t, tenantLevel(2101560, 2101569), withImages(reg, func(c *ImageConfig) { c.CacheBytes = 1 << 20 }), func(c *Config) {
		c.StateDir, c.Executor.WorkDirRoot = filepath.Join(r.dir, "state"), r.dir
	})
	g, err := r2.workspaceClient().GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "k1"})
	if err != nil || g.GetStatus().GetImage().GetDigest() != digest || !g.GetStatus().GetImage().GetPulled() {
		t.Fatalf("after the restart: %v %v, want the image pulled", g, err)
	}
	res := r2.runTask(wsTask("k2", "k1", `cat /etc/os-release`))
	if res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != "ID=tools/bash:1\n" {
		t.Errorf("a task after the restart: %s %s %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail())
	}
	if _, err := r2.workspaceClient().DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "k1"}); err != nil {
		t.Fatal(err)
	}
	// Released on delete: over the budget, it goes.
	if _, err := r2.srv.images.store.Acquire(digest); err == nil {
		t.Errorf("the deleted workspace's image is still in the store, over its budget")
	}
}

// A pull that fails for a retryable cause (the registry's 503) is
// retried in the background, its error in image_pull's message, and
// proceeds once the registry is back; the finished pull is forgotten
// after the failure TTL, and with it its hold on the image.
func TestImagePullRetried(t *testing.T) {
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "flaky/bash:1", runtime.GOARCH, true)
	reg.down.Store(true)
	r := newRig(t, tenantLevel(2101570, 2101579), withImages(reg, func(c *ImageConfig) { c.FailureTTL = 500 * time.Millisecond }))
	spec := imageTask("r1", "true", &agentv1.ImageSpec{Reference: ref})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec})
		if err != nil || resp.GetImagePull() == nil {
			t.Fatalf("Start while the registry is down: %v %v, want image_pull", resp, err)
		}
		if m := resp.GetImagePull().GetMessage(); strings.Contains(m, "503") || strings.Contains(m, "maintenance") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no retried error in image_pull: %v", resp)
		}
		time.Sleep(20 * time.Millisecond)
	}
	reg.down.Store(false)
	if resp := r.startImage(spec, false); resp.GetStatus().GetImage().GetDigest() != digest {
		t.Fatalf("after the registry came back: %v", resp)
	}
	r.finished("r1")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r.srv.images.mu.Lock()
		n := len(r.srv.images.pulls)
		r.srv.images.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pulls still remembered after the failure TTL", n)
		}
	}
}

// With a digest, the digest is pulled, never what the tag names now.
func TestImageDigestNotTag(t *testing.T) {
	reg := newImageRegistry(t)
	refA, digestA := reg.push(t, "tools/moving:1", runtime.GOARCH, true)
	refB, _ := reg.push(t, "tools/moving:2", runtime.GOARCH, true)
	// Tag 1 names image B from now on.
	rb, err := name.ParseReference(refB)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(rb)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(refA)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Tag(tag, desc); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, tenantLevel(2101580, 2101589), withImages(reg, nil))
	r.startImage(imageTask("g1", `cat /etc/os-release`, &agentv1.ImageSpec{Reference: refA, Digest: digestA}), true)
	if res := r.finished("g1"); res.GetStdout().GetTail() != "ID=tools/moving:1\n" || res.GetImage().GetDigest() != digestA {
		t.Errorf("by digest: %q image %v (%s %s), want image A", res.GetStdout().GetTail(), res.GetImage(), res.GetReason(), res.GetMessage())
	}
	r.startImage(imageTask("g2", `cat /etc/os-release`, &agentv1.ImageSpec{Reference: refA}), true)
	if res := r.finished("g2"); res.GetStdout().GetTail() != "ID=tools/moving:2\n" {
		t.Errorf("by tag: %q, want image B, which the tag names now", res.GetStdout().GetTail())
	}
}

// At the process level an image is refused, naming the isolation level,
// and the readiness names no "images" capability.
func TestImageNeedsTenantLevel(t *testing.T) {
	r := newRig(t)
	if info, _ := r.watch(); slices.Contains(info.GetReadiness().GetCapabilities(), "images") {
		t.Errorf("capabilities %v name images at the process level", info.GetReadiness().GetCapabilities())
	}
	_, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: imageTask("p1", "true", &agentv1.ImageSpec{Reference: "example.com/tools/bash:1"})})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--isolation=tenant") {
		t.Errorf("an image at the process level: %v, want FAILED_PRECONDITION naming the isolation level", err)
	}
}
