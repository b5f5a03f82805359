package packaging_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/yaml"
)

// kubeconformSchemas writes JSON schemas for kubeconform, one file per
// kind, generated from the test API server's OpenAPI v2 document: the
// built-in kinds of the k8s.io/* release in go.mod, the BashTask CRD and
// the stand-in CRDs. No schema is downloaded. The schemas are strict: an
// object with properties accepts no others, unless it preserves unknown
// fields.
func kubeconformSchemas(t *testing.T) string {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := dc.RESTClient().Get().AbsPath("/openapi/v2").SetHeader("Accept", "application/json").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("reading /openapi/v2: %v", err)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("decoding /openapi/v2: %v", err)
	}
	defs := map[string]any{}
	for name, d := range doc.Definitions {
		switch name {
		// JSON (not OpenAPI) types of the serialized forms.
		case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
			defs[name] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		case "io.k8s.apimachinery.pkg.api.resource.Quantity":
			defs[name] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
		default:
			defs[name] = strict(d)
		}
	}
	dir := t.TempDir()
	n := 0
	for name, d := range doc.Definitions {
		gvks, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			// kubeconform's {{ .Group }} is the API version's first part: the
			// group, or the version for the core group.
			groupDir := group
			if groupDir == "" {
				groupDir = version
			}
			schema := map[string]any{"$ref": "#/definitions/" + name, "definitions": defs}
			data, err := json.Marshal(schema)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, groupDir, strings.ToLower(kind)+"_"+version+".json")
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bashtask.dev", "bashtask_v1alpha1.json")); err != nil {
		t.Fatalf("no schema for the BashTask CRD among %d generated: %v", n, err)
	}
	return dir
}

// strict returns a copy of an OpenAPI schema in which every object with
// properties and no additionalProperties forbids other properties.
func strict(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v)+1)
		for k, e := range v {
			if k == "x-kubernetes-group-version-kind" || strings.HasPrefix(k, "x-kubernetes-list-") {
				out[k] = e
				continue
			}
			if k == "properties" {
				props := map[string]any{}
				for pk, pv := range e.(map[string]any) {
					props[pk] = strict(pv)
				}
				out[k] = props
				continue
			}
			out[k] = strict(e)
		}
		_, hasProps := v["properties"]
		_, hasAdditional := v["additionalProperties"]
		preserve, _ := v["x-kubernetes-preserve-unknown-fields"].(bool)
		if hasProps && !hasAdditional && !preserve {
			out["additionalProperties"] = false
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = strict(e)
		}
		return out
	default:
		return v
	}
}

// runKubeconform validates the objects with kubeconform in strict mode
// against the generated schemas; a kind without a schema is an error.
func runKubeconform(t *testing.T, schemaDir string, objs []*unstructured.Unstructured) {
	t.Helper()
	var stream []byte
	for _, o := range objs {
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		stream = append(stream, "---\n"...)
		stream = append(stream, data...)
	}
	location := filepath.Join(schemaDir, "{{ .Group }}", "{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json")
	out := runTool(t, stream, "kubeconform", "-strict", "-summary", "-output", "text",
		"-kubernetes-version", kubeVersion, "-schema-location", location, "-")
	t.Logf("kubeconform: %s", strings.TrimSpace(string(out)))
}
