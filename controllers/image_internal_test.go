package controllers

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestPullProgress(t *testing.T) {
	tests := map[string]struct {
		st   *agentv1.ImageStatus
		want string
	}{
		"progress": {
			st:   &agentv1.ImageStatus{Reference: "docker.io/library/bash:5", DownloadedBytes: 12_897_484, TotalBytes: 47_815_065},
			want: "pulling image docker.io/library/bash:5: pulled 12.3 MiB of 45.6 MiB",
		},
		"size not known yet": {
			st:   &agentv1.ImageStatus{Reference: "bash:5"},
			want: "pulling image bash:5: resolving the image's manifest",
		},
		"retried": {
			st:   &agentv1.ImageStatus{DownloadedBytes: 0, TotalBytes: 1 << 20, Message: "dial tcp: connection refused"},
			want: "pulled 0.0 MiB of 1.0 MiB; retrying after: dial tcp: connection refused",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := pullProgress(tt.st); got != tt.want {
				t.Errorf("pullProgress = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestImageReferenceError(t *testing.T) {
	for ref, bad := range map[string]bool{
		"bash": false, "docker.io/library/bash:5.2": false, "localhost:5000/a/b@" + testDigest: false,
		"Upper/Case": true, "a:b:c": true, "bash@sha256:short": true,
	} {
		msg := imageReferenceError(ptr.To(bashtaskv1alpha1.ImageReference(ref)))
		if (msg != "") != bad {
			t.Errorf("%s: error %q, want an error: %v", ref, msg, bad)
		}
		if bad && !strings.HasPrefix(msg, "spec.image ") {
			t.Errorf("%s: %q does not name spec.image", ref, msg)
		}
	}
	if msg := imageReferenceError(nil); msg != "" {
		t.Errorf("no image: %q", msg)
	}
}

// The image a workspace's EnsureWorkspace asks for: spec.image before the
// first make, the recorded digest ever after, and the node's root for a
// workspace first made without an image.
func TestWorkspaceImageSpec(t *testing.T) {
	secrets := [][]byte{[]byte(`{"auths":{}}`)}
	ws := func(image string, st *bashtaskv1alpha1.ImageStatus) *bashtaskv1alpha1.BashWorkspace {
		w := &bashtaskv1alpha1.BashWorkspace{}
		if image != "" {
			w.Spec.Image = ptr.To(bashtaskv1alpha1.ImageReference(image))
		}
		w.Status.Image = st
		return w
	}
	rootInside := func(w *bashtaskv1alpha1.BashWorkspace) *bashtaskv1alpha1.BashWorkspace {
		w.Spec.RootInside = ptr.To(true)
		return w
	}
	recorded := &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), Digest: ptr.To(testDigest)}
	tests := map[string]struct {
		ws   *bashtaskv1alpha1.BashWorkspace
		made bool
		want *agentv1.ImageSpec
	}{
		"first make with spec.image":       {ws: ws("bash:5", nil), want: &agentv1.ImageSpec{Reference: "bash:5", PullSecrets: secrets}},
		"first make without an image":      {ws: ws("", nil)},
		"pull under way, no digest yet":    {ws: ws("bash:5", &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), TotalBytes: ptr.To[int64](9)}), want: &agentv1.ImageSpec{Reference: "bash:5", PullSecrets: secrets}},
		"restore with the digest":          {ws: ws("bash:5", recorded), made: true, want: &agentv1.ImageSpec{Reference: "bash:5", Digest: testDigest, PullSecrets: secrets}},
		"agent's default image, restored":  {ws: ws("", &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("ubuntu:24.04"), Digest: ptr.To(testDigest)}), made: true, want: &agentv1.ImageSpec{Reference: "ubuntu:24.04", Digest: testDigest, PullSecrets: secrets}},
		"made on the node's root, restore": {ws: ws("", nil), made: true, want: &agentv1.ImageSpec{NodeRoot: true}},
		"root inside, first make":          {ws: rootInside(ws("bash:5", nil)), want: &agentv1.ImageSpec{Reference: "bash:5", PullSecrets: secrets, RootInside: true}},
		"root inside, restore":             {ws: rootInside(ws("bash:5", recorded)), made: true, want: &agentv1.ImageSpec{Reference: "bash:5", Digest: testDigest, PullSecrets: secrets, RootInside: true}},
		"root inside, the default image":   {ws: rootInside(ws("", nil)), want: &agentv1.ImageSpec{RootInside: true}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := workspaceImageSpec(tt.ws, tt.made, secrets)
			if !proto.Equal(got, tt.want) {
				t.Errorf("workspaceImageSpec = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTaskImageSpec(t *testing.T) {
	bt := &bashtaskv1alpha1.BashTask{}
	if got := taskImageSpec(bt, nil); got != nil {
		t.Errorf("no spec.image: %v", got)
	}
	bt.Spec.Image = ptr.To(bashtaskv1alpha1.ImageReference("bash:5"))
	want := &agentv1.ImageSpec{Reference: "bash:5", PullSecrets: [][]byte{[]byte("a"), []byte("b")}}
	if got := taskImageSpec(bt, [][]byte{[]byte("a"), []byte("b")}); !proto.Equal(got, want) {
		t.Errorf("taskImageSpec = %v, want %v", got, want)
	}
}

func TestImageStartDecision(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	task := func() *bashtaskv1alpha1.BashTask {
		bt := &bashtaskv1alpha1.BashTask{}
		bt.Spec.Image = ptr.To(bashtaskv1alpha1.ImageReference("bash:5"))
		bt.Status.NodeName = ptr.To("n1")
		bt.Status.Agent = &bashtaskv1alpha1.AgentRef{}
		setCondition(bt, bashtaskv1alpha1.ConditionScheduled, true, ReasonDispatched, "dispatched")
		return bt
	}
	t.Run("pulling", func(t *testing.T) {
		bt := task()
		d, ok := imageStartDecision(bt, &agentpool.ImagePullingError{Node: "n1", Status: &agentv1.ImageStatus{DownloadedBytes: 3 << 20, TotalBytes: 6 << 20}}, now)
		if !ok || d.write != "pull" || d.result.RequeueAfter != time.Second || isTerminal(bt) {
			t.Fatalf("decision %+v ok=%v terminal=%v", d, ok, isTerminal(bt))
		}
		im := bt.Status.Image
		if ptr.Deref(im.Requested, "") != "bash:5" || ptr.Deref(im.DownloadedBytes, 0) != 3<<20 || ptr.Deref(im.TotalBytes, 0) != 6<<20 || im.Digest != nil {
			t.Errorf("status.image = %+v", im)
		}
		c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionImagePulled)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != bashtaskv1alpha1.ReasonImagePulling || c.Message != "pulled 3.0 MiB of 6.0 MiB" {
			t.Errorf("ImagePulled = %+v", c)
		}
		if why, msg := progressOf(bt); why != ReasonPending || !strings.Contains(msg, "pulling the task's image: pulled 3.0 MiB of 6.0 MiB") {
			t.Errorf("progressOf = %s, %q", why, msg)
		}
		if !isDispatched(bt) {
			t.Error("a task whose image is pulled lost its dispatch")
		}
	})
	t.Run("failure", func(t *testing.T) {
		bt := task()
		d, ok := imageStartDecision(bt, &agentpool.ImageFailedError{Node: "n1", Failure: &agentv1.ImageFailure{Reason: "ImageNotFound", Message: "bash:5: MANIFEST_UNKNOWN"}}, now)
		if !ok || d.write != "terminal" || len(d.events) != 1 || d.events[0].reason != "ImageNotFound" {
			t.Fatalf("decision %+v ok=%v", d, ok)
		}
		if reasonOf(&bt.Status) != bashtaskv1alpha1.ReasonImageNotFound || !strings.Contains(ptr.Deref(bt.Status.Message, ""), "MANIFEST_UNKNOWN") {
			t.Errorf("reason %s message %q", reasonOf(&bt.Status), ptr.Deref(bt.Status.Message, ""))
		}
		setReadiness(bt)
		if c := meta.FindStatusCondition(bt.Status.Conditions, bashtaskv1alpha1.ConditionStalled); c == nil || c.Reason != "ImageNotFound" {
			t.Errorf("Stalled = %+v", c)
		}
	})
	t.Run("unknown reason", func(t *testing.T) {
		bt := task()
		if _, ok := imageStartDecision(bt, &agentpool.ImageFailedError{Node: "n1", Failure: &agentv1.ImageFailure{Reason: "Odd", Message: "m"}}, now); !ok {
			t.Fatal("not decided")
		}
		if reasonOf(&bt.Status) != bashtaskv1alpha1.ReasonStartFailed || !strings.Contains(ptr.Deref(bt.Status.Message, ""), `"Odd"`) {
			t.Errorf("reason %s message %q", reasonOf(&bt.Status), ptr.Deref(bt.Status.Message, ""))
		}
	})
	t.Run("other error", func(t *testing.T) {
		if _, ok := imageStartDecision(task(), errors.New("unavailable"), now); ok {
			t.Error("decided on an error that is not an image answer")
		}
	})
}

// A workspace's node pulls, then fails or makes it: the digest once
// recorded survives a pull, a failure names its reason in Ready and
// Stalled, a success records the digest and clears the progress.
func TestWorkspaceImageAnswer(t *testing.T) {
	r := &BashWorkspaceReconciler{}
	newWS := func() *bashtaskv1alpha1.BashWorkspace {
		ws := &bashtaskv1alpha1.BashWorkspace{}
		ws.Spec.Image = ptr.To(bashtaskv1alpha1.ImageReference("bash:5"))
		ws.Status.NodeName = ptr.To("n1")
		return ws
	}
	t.Run("pull of a restore keeps the digest", func(t *testing.T) {
		ws := newWS()
		ws.Status.Image = &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), Digest: ptr.To(testDigest)}
		res, done, err := r.imageAnswer(ws, "n1", &agentv1.EnsureWorkspaceResponse{ImagePull: &agentv1.ImageStatus{Reference: "bash:5", DownloadedBytes: 1 << 20, TotalBytes: 2 << 20}}, &workspacePass{})
		if !done || err != nil || res.RequeueAfter != time.Second {
			t.Fatalf("res %+v done %v err %v", res, done, err)
		}
		if ptr.Deref(ws.Status.Image.Digest, "") != testDigest || ptr.Deref(ws.Status.Image.DownloadedBytes, 0) != 1<<20 {
			t.Errorf("status.image = %+v", ws.Status.Image)
		}
		setWorkspaceConditions(ws)
		if c := meta.FindStatusCondition(ws.Status.Conditions, bashtaskv1alpha1.ConditionReconciling); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("Reconciling = %+v", c)
		}
		if !strings.Contains(ptr.Deref(ws.Status.Message, ""), "node n1 is pulling image bash:5: pulled 1.0 MiB of 2.0 MiB") {
			t.Errorf("message %q", ptr.Deref(ws.Status.Message, ""))
		}
	})
	t.Run("failure", func(t *testing.T) {
		ws := newWS()
		p := &workspacePass{}
		_, done, err := r.imageAnswer(ws, "n1", &agentv1.EnsureWorkspaceResponse{ImageFailure: &agentv1.ImageFailure{Reason: "ImageUnauthorized", Message: "DENIED"}}, p)
		if !done || err == nil || len(p.events) != 1 || p.events[0].reason != "ImageUnauthorized" {
			t.Fatalf("done %v err %v events %+v", done, err, p.events)
		}
		setWorkspaceConditions(ws)
		for _, typ := range []string{bashtaskv1alpha1.ConditionReady, bashtaskv1alpha1.ConditionStalled, bashtaskv1alpha1.ConditionImagePulled} {
			if c := meta.FindStatusCondition(ws.Status.Conditions, typ); c == nil || c.Reason != "ImageUnauthorized" {
				t.Errorf("%s = %+v", typ, c)
			}
		}
		if workspacePhaseOf(&ws.Status) != bashtaskv1alpha1.WorkspaceFailed {
			t.Errorf("phase %s", workspacePhaseOf(&ws.Status))
		}
		bt := &bashtaskv1alpha1.BashTask{}
		bt.Spec.Workspace = ptr.To("w")
		ws.Name = "w"
		if c := workspaceVerdict(bt, ws); c.end != bashtaskv1alpha1.ReasonWorkspaceUnavailable || !strings.Contains(c.message, "ImageUnauthorized") {
			t.Errorf("a waiting task: %+v", c)
		}
	})
	t.Run("made", func(t *testing.T) {
		ws := newWS()
		ws.Status.Image = &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), DownloadedBytes: ptr.To[int64](5), TotalBytes: ptr.To[int64](5)}
		if _, done, _ := r.imageAnswer(ws, "n1", &agentv1.EnsureWorkspaceResponse{Status: &agentv1.WorkspaceStatus{}}, &workspacePass{}); done {
			t.Fatal("a made workspace was taken for a pull")
		}
		applyWorkspaceStatus(ws, &agentv1.WorkspaceStatus{Image: &agentv1.ImageStatus{Reference: "bash:5", Digest: testDigest, Pulled: true}}, "n1")
		want := bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), Digest: ptr.To(testDigest)}
		if im := ptr.Deref(ws.Status.Image, bashtaskv1alpha1.ImageStatus{}); ptr.Deref(im.Digest, "") != testDigest || im.DownloadedBytes != nil || im.TotalBytes != nil || ptr.Deref(im.Requested, "") != "bash:5" {
			t.Errorf("status.image = %+v, want %+v", im, want)
		}
		if c := meta.FindStatusCondition(ws.Status.Conditions, bashtaskv1alpha1.ConditionImagePulled); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("ImagePulled = %+v", c)
		}
		// A later report without the image (an older agent) keeps the
		// recorded digest.
		applyWorkspaceStatus(ws, &agentv1.WorkspaceStatus{}, "n1")
		if ptr.Deref(ws.Status.Image, bashtaskv1alpha1.ImageStatus{}).Digest == nil {
			t.Error("the recorded digest was dropped")
		}
	})
}

// An object with an image goes only to an agent with an image store.
func TestChooseAgentForImage(t *testing.T) {
	plain := agentpool.AgentState{Node: "a", Ready: true, Isolation: "tenant", Capabilities: []string{"workspaces"}}
	store := agentpool.AgentState{Node: "b", Ready: true, Isolation: "tenant", Capabilities: []string{"workspaces", "images"}, Running: 5}
	pl := chooseAgent(placementRequest{what: "the task", image: true}, []agentpool.AgentState{plain, store}, nil)
	if pl.agent == nil || pl.agent.Node != "b" {
		t.Errorf("placed on %+v, want node b, the one with an image store", pl.agent)
	}
	pl = chooseAgent(placementRequest{what: "the task", image: true}, []agentpool.AgentState{plain}, nil)
	if pl.agent != nil || pl.reason != ReasonNoAgent || !strings.Contains(pl.why, "the images capability") {
		t.Errorf("without an image store: %+v", pl)
	}
	if pl := chooseAgent(placementRequest{what: "the task"}, []agentpool.AgentState{plain}, nil); pl.agent == nil {
		t.Errorf("without an image: %+v", pl)
	}
}

// A workspace root inside its image goes only to an agent with the
// root-inside capability (an image store and user namespaces).
func TestChooseAgentForRootInside(t *testing.T) {
	store := agentpool.AgentState{Node: "a", Ready: true, Isolation: "tenant", Capabilities: []string{"workspaces", "images"}}
	userns := agentpool.AgentState{Node: "b", Ready: true, Isolation: "tenant", Capabilities: []string{"workspaces", "images", "root-inside"}, Running: 5}
	req := placementRequest{what: "the workspace", workspace: true, image: true, rootInside: true, anyCapacity: true}
	if pl := chooseAgent(req, []agentpool.AgentState{store, userns}, nil); pl.agent == nil || pl.agent.Node != "b" {
		t.Errorf("placed on %+v, want node b, the one with user namespaces", pl.agent)
	}
	pl := chooseAgent(req, []agentpool.AgentState{store}, nil)
	if pl.agent != nil || pl.reason != ReasonNoAgent || !strings.Contains(pl.why, "spec.rootInside") || !strings.Contains(pl.why, "root-inside capability") {
		t.Errorf("without user namespaces: %+v", pl)
	}
}
