package plugin

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestRunImageFlags(t *testing.T) {
	bt, err := buildTask("ns", runFlags{image: "docker.io/library/bash:5", imagePullSecrets: []string{"regcred", "mirror"}}, false, []string{"true"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(bt.Spec.Image, ""); got != "docker.io/library/bash:5" {
		t.Errorf("spec.image = %q", got)
	}
	if want := []bashtaskv1alpha1.ImagePullSecret{{Name: "regcred"}, {Name: "mirror"}}; len(bt.Spec.ImagePullSecrets) != 2 ||
		bt.Spec.ImagePullSecrets[0] != want[0] || bt.Spec.ImagePullSecrets[1] != want[1] {
		t.Errorf("spec.imagePullSecrets = %v, want %v", bt.Spec.ImagePullSecrets, want)
	}
	for _, tc := range []struct {
		f    runFlags
		want string
	}{
		{runFlags{image: "bash:5", workspace: "s1"}, "--image and --workspace"},
		{runFlags{imagePullSecrets: []string{"regcred"}, workspace: "s1"}, "--image and --workspace"},
		{runFlags{imagePullSecrets: []string{"regcred"}}, "--image-pull-secret needs --image"},
		{runFlags{image: "Upper/Case"}, `--image "Upper/Case": spec.image is not an image reference`},
		{runFlags{image: "bash:5", imagePullSecrets: make([]string, 17)}, "17 Secrets, over the limit of 16"},
		{runFlags{image: "bash:5", imagePullSecrets: []string{""}}, "must not be empty"},
	} {
		if _, err := buildTask("ns", tc.f, false, []string{"true"}, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.f, err, tc.want)
		}
	}
}

// TestRunImageWithWorkspaceRefusedOffline: the refusal comes before the
// API server is contacted (the kubeconfig points nowhere).
func TestRunImageWithWorkspaceRefusedOffline(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"--kubeconfig", "/nonexistent/kubeconfig", "run", "-w", "s1", "--image", "bash:5", "--", "true"}
	code := Main(t.Context(), Options{IOStreams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}}, args)
	if code != ExitPluginError || !strings.Contains(errOut.String(), "--image and --workspace") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

func TestWorkspaceImageFlags(t *testing.T) {
	spec, err := workspaceSpec(workspaceCreateFlags{snapshotAfterTask: -1, image: "ghcr.io/org/tools:1", imagePullSecrets: []string{"regcred"}})
	if err != nil || ptr.Deref(spec.Image, "") != "ghcr.io/org/tools:1" || len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("spec %+v, %v", spec, err)
	}
	if _, err := workspaceSpec(workspaceCreateFlags{snapshotAfterTask: -1, image: "a:b:c"}); err == nil || !strings.Contains(err.Error(), `--image "a:b:c"`) {
		t.Errorf("bad --image: %v", err)
	}
	if spec.RootInside != nil {
		t.Errorf("spec.rootInside %v without --root-inside, want unset", *spec.RootInside)
	}
	spec, err = workspaceSpec(workspaceCreateFlags{snapshotAfterTask: -1, image: "ghcr.io/org/tools:1", rootInside: true})
	if err != nil || !ptr.Deref(spec.RootInside, false) {
		t.Errorf("--root-inside: spec %+v, %v", spec, err)
	}
}

func TestPrintWorkspacesImage(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ws := func(name string, spec *bashtaskv1alpha1.ImageReference, st *bashtaskv1alpha1.ImageStatus) bashtaskv1alpha1.BashWorkspace {
		return bashtaskv1alpha1.BashWorkspace{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			Spec:       bashtaskv1alpha1.BashWorkspaceSpec{Image: spec},
			Status:     bashtaskv1alpha1.BashWorkspaceStatus{Image: st},
		}
	}
	ref := ptr.To(bashtaskv1alpha1.ImageReference("bash:5"))
	items := []bashtaskv1alpha1.BashWorkspace{
		ws("pulled", ref, &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), Digest: ptr.To("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")}),
		ws("pulling", ref, &bashtaskv1alpha1.ImageStatus{Requested: ptr.To("bash:5"), DownloadedBytes: ptr.To[int64](25), TotalBytes: ptr.To[int64](100)}),
		ws("new", ref, nil),
		ws("noderoot", nil, nil),
	}
	var out bytes.Buffer
	if err := printWorkspaces(&out, items, now, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][2]string{{"IMAGE", "DIGEST"}, {"bash:5", "sha256:0123456789ab"}, {"bash:5", "pulling:25%"}, {"bash:5", "<none>"}, {"<none>", "<none>"}}
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) != 11 || f[7] != want[i][0] || f[8] != want[i][1] {
			t.Errorf("line %d: %q, want IMAGE %s and DIGEST %s in columns 8 and 9", i, line, want[i][0], want[i][1])
		}
	}
}

func TestPullNote(t *testing.T) {
	bt := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: "t"}}
	bt.Status.NodeName = ptr.To("n1")
	if got := pullNote(bt); got != "" {
		t.Errorf("no pull: %q", got)
	}
	bt.Status.Conditions = []metav1.Condition{{Type: bashtaskv1alpha1.ConditionImagePulled, Status: metav1.ConditionFalse, Reason: bashtaskv1alpha1.ReasonImagePulling,
		Message: "pulling image bash:5: pulled 12.3 MiB of 45.6 MiB"}}
	if got, want := pullNote(bt), "task t: node n1 is pulling image bash:5: pulled 12.3 MiB of 45.6 MiB"; got != want {
		t.Errorf("pullNote = %q, want %q", got, want)
	}

	// One line per pullNoteEvery, however often the status changes.
	clock := now0
	var errOut bytes.Buffer
	a := &app{opts: Options{Now: func() time.Time { return clock }}, errOut: &errOut}
	n := &waitNotes{a: a, last: bt}
	for range 10 {
		n.observe(bt)
		clock = clock.Add(time.Second)
	}
	if got := strings.Count(errOut.String(), "is pulling image"); got != 4 {
		t.Errorf("%d notes in 10 s, want 4 (one per %s):\n%s", got, pullNoteEvery, errOut.String())
	}
}

var now0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
