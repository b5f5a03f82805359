package packaging_test

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
)

// TestChartDefaultImage checks the agent's --default-image as the chart
// renders it (docs/install.md, "Images"): by default the release's Task
// image with the chart's appVersion, as the agent's own image; a
// repository and tag of one's own; and none at all with an empty
// repository or at the process level, where the agent refuses the flag.
func TestChartDefaultImage(t *testing.T) {
	appVersion := chartAppVersion(t)
	for _, tc := range []struct {
		name string
		set  []string
		want string // "" for no --default-image
	}{
		{"default", nil, "ghcr.io/bashtask/bashtask-" + string(nodeimages.Task) + ":" + appVersion},
		{"mirror", []string{"agent.images.defaultImage.repository=registry.example:5000/bashtask/bashtask-task", "agent.images.defaultImage.tag=v9"}, "registry.example:5000/bashtask/bashtask-task:v9"},
		{"off", []string{"agent.images.defaultImage.repository="}, ""},
		{"process level", []string{"agent.isolation=process"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := []string{"helm", "template", chartRelease, "charts/bashtask", "--namespace", chartNamespace, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				cmd = append(cmd, "--set", s)
			}
			var got string
			var found bool
			for _, o := range render(t, rendering{name: tc.name, cmd: cmd}) {
				if o.GetKind() != "DaemonSet" {
					continue
				}
				args, _, err := unstructuredSlice(o.Object, "spec", "template", "spec", "containers")
				if err != nil || len(args) == 0 {
					t.Fatalf("the agent DaemonSet has no containers: %v", err)
				}
				c := args[0].(map[string]any)
				var flags []string
				for _, a := range c["args"].([]any) {
					flags = append(flags, a.(string))
				}
				got, found = flagValues(flags)["default-image"]
			}
			if got != tc.want || found != (tc.want != "") {
				t.Errorf("--default-image = %q (present: %t), want %q", got, found, tc.want)
			}
		})
	}
}

// chartAppVersion is the chart's appVersion (Chart.yaml).
func chartAppVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "charts", "bashtask", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml: no appVersion (%v)", err)
	}
	return c.AppVersion
}
