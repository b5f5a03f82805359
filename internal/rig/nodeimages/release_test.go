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

// TestRegistryImage assembles the one-node cluster's registry image around
// a stand-in binary: its one program, a numeric user and no base, and it
// is built only when named.
func TestRegistryImage(t *testing.T) {
	if slices.Contains(Kinds(), Registry) || slices.Contains(ReleaseKinds(), Registry) {
		t.Errorf("the registry image is built by default (Kinds %v, ReleaseKinds %v); it is the test cluster's", Kinds(), ReleaseKinds())
	}
	o := testOptions(t, Registry)
	work := t.TempDir()
	fakeBinary(t, filepath.Join(work, "bin"), "registry")
	got, err := writeImages(o, []Kind{Registry}, filepath.Join(work, "bin"), nil, work)
	if err != nil {
		t.Fatal(err)
	}
	ref := "localhost/bashtask/registry:test"
	if len(got) != 1 || got[0].Ref != ref || got[0].Kind != Registry {
		t.Fatalf("writeImages() = %+v, want %s", got, ref)
	}
	_, cfg, layers := readArchive(t, got[0].Archive, ref)
	if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/registry"}) {
		t.Errorf("config: user %q, entrypoint %q; want 65532:65532 and /registry", cfg.Config.User, cfg.Config.Entrypoint)
	}
	if len(layers) != 1 || len(layers[0]) != 1 || layers[0][0].Name != "registry" {
		t.Errorf("layers %+v, want the binary alone", layers)
	}
}
