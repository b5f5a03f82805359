package workspace_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rigregistry "github.com/bashtask/bashtask-operator/internal/rig/registry"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// testRegistry is go-containerregistry's in-process registry on
// loopback (plain HTTP, as the agents speak to loopback): repositories
// under private/ want basic authentication, and while slowBlobs is set
// each layer download waits that long, so that a pull lasts.
type testRegistry struct {
	host      string
	slowBlobs atomic.Int64 // nanoseconds
}

func newImageRegistry(t *testing.T) *testRegistry {
	t.Helper()
	if caps := rig.Registry.Agent("node-a").Capabilities; !slices.Contains(caps, "images") {
		testutil.SkipUnlessStrictf(t, "the agents have no image store (capabilities %v, without images)", caps)
	}
	reg := rigregistry.GuardPrivateForTest(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	r := &testRegistry{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if d := time.Duration(r.slowBlobs.Load()); d > 0 && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
			time.Sleep(d)
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// pullSecret is a kubernetes.io/dockerconfigjson Secret of the registry's
// credentials.
func (r *testRegistry) pullSecret(ns, name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: rigregistry.TestDockerConfigJSON(r.host)},
	}
}

// push builds an image of one layer for this node (busybox, bash unless
// withBash is false, and /etc/marker holding marker) and pushes it as
// repoTag; it returns the reference and its digest.
func (r *testRegistry) push(t *testing.T, repoTag, marker string, withBash bool) (string, string) {
	t.Helper()
	img := rigregistry.BusyboxImage{
		NoBash: !withBash, Applets: []string{"sh", "cat", "echo", "id", "true"},
		Files: map[string]string{"etc/marker": marker + "\n"},
	}.BuildForTest(t)
	ref := r.host + "/" + repoTag
	nr, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := authn.FromConfig(authn.AuthConfig{Username: rigregistry.TestUser, Password: rigregistry.TestPassword})
	if err := remote.Write(nr, img, remote.WithAuth(auth)); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ref, d.String()
}

// imageRequests records the image of the first EnsureWorkspace the agents
// were asked for each workspace UID and epoch.
var imageRequests ensureImages

// ensureImages is a record of EnsureWorkspace images.
type ensureImages struct{ m sync.Map }

type ensureKey struct {
	uid   string
	epoch int64
}

func (e *ensureImages) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*agentv1.EnsureWorkspaceRequest); ok {
		ref := r.GetSpec().GetRef()
		e.m.LoadOrStore(ensureKey{ref.GetUid(), ref.GetEpoch()}, proto.Clone(r.GetSpec().GetImage()))
	}
	return handler(ctx, req)
}

// image is the image of the first EnsureWorkspace of ws's epoch; nil
// for none.
func (e *ensureImages) image(ws *v1.BashWorkspace, epoch int64) *agentv1.ImageSpec {
	v, ok := e.m.Load(ensureKey{string(ws.UID), epoch})
	if !ok {
		return nil
	}
	im, _ := v.(*agentv1.ImageSpec)
	return im
}

// createImageWorkspace creates ws and deletes it when the test ends,
// waiting until it is gone: a workspace left on node-a or node-b would
// count in the drain of TestAgentShutdownMovesWorkspaces.
func createImageWorkspace(t *testing.T, ws *v1.BashWorkspace) {
	t.Helper()
	create(t, ws)
	t.Cleanup(func() {
		if err := k8s.Delete(context.Background(), ws); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting workspace %s: %v", ws.Name, err)
			return
		}
		waitGone(t, ws, waitLong)
	})
}

// withImage sets spec.image and spec.imagePullSecrets of a workspace.
func withImage(ref string, secrets ...string) func(*v1.BashWorkspace) {
	return func(ws *v1.BashWorkspace) {
		ws.Spec.Image = ptr.To(v1.ImageReference(ref))
		for _, s := range secrets {
			ws.Spec.ImagePullSecrets = append(ws.Spec.ImagePullSecrets, v1.ImagePullSecret{Name: s})
		}
	}
}

// imageTask is a task without a workspace in image ref.
func imageTask(ns, name, ref, command string, secrets ...string) *v1.BashTask {
	bt := newTask(ns, name, "", command, func(bt *v1.BashTask) {
		bt.Spec.Workspace = nil
		bt.Spec.Image = ptr.To(v1.ImageReference(ref))
		for _, s := range secrets {
			bt.Spec.ImagePullSecrets = append(bt.Spec.ImagePullSecrets, v1.ImagePullSecret{Name: s})
		}
	})
	return bt
}

// The tests of images need agents with an image store (the images
// capability) and Debian's static bash and busybox for their images
// (make test-packages); without either they skip, and fail with
// BASHTASK_STRICT=1.

// A task without a workspace in an image: while its node pulls, it stays
// dispatched with the progress in ImagePulled and status.image; then it
// runs in the image, and status.image records the digest.
func TestImageTaskPullsThenRuns(t *testing.T) {
	ns := newNamespace(t)
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "tools/bash:1", "task-image", true)
	reg.slowBlobs.Store(int64(3 * time.Second))
	bt := imageTask(ns, "in-image", ref, "cat /etc/marker")
	create(t, bt)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := getTask(g, bt).Status
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionImagePulled)
		g.Expect(c).NotTo(BeNil(), "status: %s", dump.OneLine(st))
		g.Expect(c.Reason).To(Equal(v1.ReasonImagePulling))
		g.Expect(c.Message).To(ContainSubstring("pulling image " + ref))
		g.Expect(st.NodeName).NotTo(BeNil(), "a task whose image is pulled stays dispatched")
		g.Expect(st.Reason).To(BeNil())
		g.Expect(st.Image).NotTo(BeNil())
		g.Expect(st.Image.Requested).To(HaveValue(Equal(ref)))
		g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReconciling)).To(BeTrue())
	}).WithTimeout(waitLong).WithPolling(100 * time.Millisecond).Should(Succeed())
	reg.slowBlobs.Store(0)
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, waitLong)[bt.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(stdout(done)).To(Equal("task-image\n"))
	g.Expect(done.Status.Image).NotTo(BeNil())
	g.Expect(done.Status.Image.Digest).To(HaveValue(Equal(digest)))
	g.Expect(done.Status.Image.DownloadedBytes).To(BeNil())
	g.Expect(meta.IsStatusConditionTrue(done.Status.Conditions, v1.ConditionImagePulled)).To(BeTrue(), "conditions: %v", done.Status.Conditions)
}

// Each way a pull fails ends a task with its reason; a private image
// pulls with its pull secret.
func TestImageTaskFailures(t *testing.T) {
	ns := newNamespace(t)
	reg := newImageRegistry(t)
	private, _ := reg.push(t, "private/tools:1", "private", true)
	noBash, _ := reg.push(t, "tools/nobash:1", "nobash", false)
	g := NewWithT(t)
	g.Expect(k8s.Create(t.Context(), reg.pullSecret(ns, "regcred"))).To(Succeed())
	tasks := map[string]struct {
		bt     *v1.BashTask
		reason v1.Reason
	}{
		"not-found":    {imageTask(ns, "not-found", reg.host+"/tools/none:1", "true"), v1.ReasonImageNotFound},
		"unauthorized": {imageTask(ns, "unauthorized", private, "true"), v1.ReasonImageUnauthorized},
		"no-bash":      {imageTask(ns, "no-bash", noBash, "true"), v1.ReasonImageShellMissing},
		"with-secret":  {imageTask(ns, "with-secret", private, "cat /etc/marker", "regcred"), v1.ReasonSucceeded},
	}
	var names []string
	for n, tc := range tasks {
		create(t, tc.bt)
		names = append(names, n)
	}
	done := testutil.WaitTerminal(t, k8s, ns, names, waitLong)
	for n, tc := range tasks {
		got := done[n]
		g.Expect(got.Status.Reason).To(HaveValue(Equal(tc.reason)), "%s: status: %s", n, dump.OneLine(got.Status))
		if tc.reason != v1.ReasonSucceeded {
			g.Expect(got.Status.Message).NotTo(BeNil(), n)
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionStalled)).To(BeTrue(), n)
		}
	}
	g.Expect(stdout(done["with-secret"])).To(Equal("private\n"))
}

// A workspace in an image: its node pulls it (Pending, ImagePulled=False
// with the progress), then it is Ready with the digest recorded, and its
// tasks run there with a copy of its status.image. Suspended and resumed
// after the tag moved, it is restored in the digest of its first make.
func TestImageWorkspaceDigestResolvedOnce(t *testing.T) {
	ns := newNamespace(t)
	reg := newImageRegistry(t)
	ref, digest := reg.push(t, "tools/ws:1", "first", true)
	reg.slowBlobs.Store(int64(3 * time.Second))
	ws := newWorkspace(ns, "img", withImage(ref))
	createImageWorkspace(t, ws)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.WorkspacePending)), "status: %s", dump.OneLine(st))
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionImagePulled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(v1.ReasonImagePulling))
		g.Expect(st.Message).To(HaveValue(ContainSubstring("is pulling image " + ref)))
		g.Expect(st.Image).NotTo(BeNil())
		g.Expect(st.Image.TotalBytes).NotTo(BeNil())
	}).WithTimeout(waitLong).WithPolling(100 * time.Millisecond).Should(Succeed())
	reg.slowBlobs.Store(0)
	ready := waitPhase(t, ws, v1.WorkspaceReady)
	g.Expect(ready.Status.Image).NotTo(BeNil())
	g.Expect(ready.Status.Image.Requested).To(HaveValue(Equal(ref)))
	g.Expect(ready.Status.Image.Digest).To(HaveValue(Equal(digest)))
	g.Expect(ready.Status.Image.TotalBytes).To(BeNil())
	g.Expect(meta.IsStatusConditionTrue(ready.Status.Conditions, v1.ConditionImagePulled)).To(BeTrue())

	first := newTask(ns, "first", "img", "cat /etc/marker; echo kept > f")
	create(t, first)
	done := testutil.WaitTerminal(t, k8s, ns, []string{first.Name}, waitLong)[first.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(stdout(done)).To(Equal("first\n"))
	g.Expect(done.Status.Image).NotTo(BeNil())
	g.Expect(done.Status.Image.Digest).To(HaveValue(Equal(digest)))

	// The tag moves; the restored workspace keeps the digest it resolved.
	_, moved := reg.push(t, "tools/ws:1", "second", true)
	g.Expect(moved).NotTo(Equal(digest))
	setSuspend(t, ws, true)
	waitSuspendedAndReleased(t, ws)
	setSuspend(t, ws, false)
	after := newTask(ns, "after", "img", "cat /etc/marker; cat f")
	create(t, after)
	restored := waitPhase(t, ws, v1.WorkspaceReady)
	g.Expect(restored.Status.Epoch).To(HaveValue(Equal(int64(2))))
	g.Expect(restored.Status.Image.Digest).To(HaveValue(Equal(digest)))
	first1, restore := imageRequests.image(ready, 1), imageRequests.image(ready, 2)
	g.Expect(first1.GetReference()).To(Equal(ref))
	g.Expect(first1.GetDigest()).To(BeEmpty(), "the first make resolves the tag")
	g.Expect(restore.GetReference()).To(Equal(ref))
	g.Expect(restore.GetDigest()).To(Equal(digest), "a restore asks for the digest of the first make")
	done = testutil.WaitTerminal(t, k8s, ns, []string{after.Name}, waitLong)[after.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "status: %s", dump.OneLine(done.Status))
	g.Expect(stdout(done)).To(Equal("first\nkept\n"), "restored in the image of the first make, not the moved tag")
}

// A workspace whose image cannot be pulled fails with the reason, and a
// task waiting for it ends WorkspaceUnavailable naming it.
func TestImageWorkspaceFailure(t *testing.T) {
	ns := newNamespace(t)
	reg := newImageRegistry(t)
	private, _ := reg.push(t, "private/ws:1", "private", true)
	ws := newWorkspace(ns, "denied", withImage(private))
	createImageWorkspace(t, ws)
	waiting := newTask(ns, "waiting", "denied", "true")
	create(t, waiting)
	failed := waitPhase(t, ws, v1.WorkspaceFailed)
	g := NewWithT(t)
	for _, typ := range []string{v1.ConditionReady, v1.ConditionStalled, v1.ConditionImagePulled} {
		c := meta.FindStatusCondition(failed.Status.Conditions, typ)
		g.Expect(c).NotTo(BeNil(), typ)
		g.Expect(c.Reason).To(Equal(string(v1.ReasonImageUnauthorized)), typ)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{waiting.Name}, waitLong)[waiting.Name]
	g.Expect(done.Status.Reason).To(HaveValue(Equal(v1.ReasonWorkspaceUnavailable)))
	g.Expect(done.Status.Message).To(HaveValue(ContainSubstring(string(v1.ReasonImageUnauthorized))))
	g.Eventually(func(g Gomega) []string { return eventReasons(g, ns, "denied") }).WithTimeout(10 * time.Second).Should(ContainElement(string(v1.ReasonImageUnauthorized)))

	// With the pull secret, the same image makes a workspace.
	g.Expect(k8s.Create(t.Context(), reg.pullSecret(ns, "regcred"))).To(Succeed())
	ok := newWorkspace(ns, "allowed", withImage(private, "regcred"))
	createImageWorkspace(t, ok)
	waitPhase(t, ok, v1.WorkspaceReady)
}
