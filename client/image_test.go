package client

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestRunOptionsImage(t *testing.T) {
	task, err := taskOf(RunOptions{Command: "true", Image: "bash:5", ImagePullSecrets: []string{"regcred", "mirror"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(task.Spec.Image, ""); got != "bash:5" {
		t.Errorf("spec.image = %q", got)
	}
	want := []bashtaskv1alpha1.ImagePullSecret{{Name: "regcred"}, {Name: "mirror"}}
	if len(task.Spec.ImagePullSecrets) != 2 || task.Spec.ImagePullSecrets[0] != want[0] || task.Spec.ImagePullSecrets[1] != want[1] {
		t.Errorf("spec.imagePullSecrets = %v, want %v", task.Spec.ImagePullSecrets, want)
	}

	task, err = taskOf(RunOptions{Command: "true"})
	if err != nil || task.Spec.Image != nil || task.Spec.ImagePullSecrets != nil {
		t.Errorf("no image: %v, %v, %v", task.Spec.Image, task.Spec.ImagePullSecrets, err)
	}

	for name, tt := range map[string]struct {
		opts RunOptions
		want string
	}{
		"with a workspace":         {RunOptions{Command: "true", Image: "bash:5", Workspace: "w"}, "spec.image must be unset with spec.workspace"},
		"secrets without an image": {RunOptions{Command: "true", ImagePullSecrets: []string{"regcred"}}, "RunOptions.ImagePullSecrets: spec.imagePullSecrets needs spec.image"},
		"too many secrets":         {RunOptions{Command: "true", Image: "bash:5", ImagePullSecrets: make([]string, 17)}, "17 Secrets, over the limit of 16"},
	} {
		if _, err := taskOf(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", name, err, tt.want)
		}
	}
}

func TestWorkspaceOptionsImage(t *testing.T) {
	ws, err := workspaceOf(WorkspaceOptions{Name: "w", Image: "ghcr.io/org/tools@sha256:" + strings.Repeat("a", 64), ImagePullSecrets: []string{"regcred"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(ws.Spec.Image, ""); !strings.HasPrefix(string(got), "ghcr.io/org/tools@sha256:") {
		t.Errorf("spec.image = %q", got)
	}
	if len(ws.Spec.ImagePullSecrets) != 1 || ws.Spec.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("spec.imagePullSecrets = %v", ws.Spec.ImagePullSecrets)
	}
	if _, err := workspaceOf(WorkspaceOptions{Name: "w", ImagePullSecrets: []string{"regcred"}}); err == nil || !strings.Contains(err.Error(), "WorkspaceOptions.ImagePullSecrets") {
		t.Errorf("secrets without an image: %v", err)
	}
}
