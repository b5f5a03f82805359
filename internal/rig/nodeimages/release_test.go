package nodeimages

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDockerfileTaskPackages checks that the Dockerfile's task target
// (what `make docker-build` publishes as bashtask-task) installs the
// packages of the Task image `make images` builds, so that the chart's
// default image is the same environment whichever way it was built.
func TestDockerfileTaskPackages(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	stage := regexp.MustCompile(`(?ms)^FROM \S+ AS task$(.*?)(^FROM |\z)`).FindStringSubmatch(text)
	if stage == nil {
		t.Fatal("Dockerfile: no task stage")
	}
	install := regexp.MustCompile(`apt-get install -y --no-install-recommends ([a-z0-9.+ -]+?) &&`).FindStringSubmatch(stage[1])
	if install == nil {
		t.Fatal("Dockerfile: the task stage has no apt-get install")
	}
	got, want := strings.Fields(install[1]), taskPackages()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the Dockerfile's task stage installs %v; the Task image has %v", got, want)
	}
}

// TestReleaseKinds checks that a release (hack/images without -only)
// builds the Task image, under the name the chart's default image
// (agent.images.defaultImage) names: bashtask-task.
func TestReleaseKinds(t *testing.T) {
	if !slices.Contains(ReleaseKinds(), Task) {
		t.Errorf("ReleaseKinds() = %v, without %s", ReleaseKinds(), Task)
	}
	if n := spec(Task).name; n != "bashtask-task" {
		t.Errorf("the Task image's name is %q, want bashtask-task (charts/bashtask/values.yaml)", n)
	}
	values, err := os.ReadFile(filepath.Join("..", "..", "..", "charts", "bashtask", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(values), "repository: ghcr.io/bashtask/"+spec(Task).name+"\n") {
		t.Errorf("charts/bashtask/values.yaml does not name ghcr.io/bashtask/%s", spec(Task).name)
	}
}
