package report

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
)

func TestDocumentAddAndWrite(t *testing.T) {
	d := NewDocument()
	d.Add("system", phase.Figures{"e2e.latency_p50_ms": 12.3456, "e2e.ratio_to_raw": math.NaN(), "x": math.Inf(1)})
	d.Add("executor", phase.Figures{"executor.overhead_ratio": 1.006})
	path := filepath.Join(t.TempDir(), "out", "bench.json")
	if err := d.Write(path); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got Document
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]phase.Figures{
		"system":   {"e2e.latency_p50_ms": 12.35},
		"executor": {"executor.overhead_ratio": 1.01},
	}
	if diff := cmp.Diff(want, got.Phases); diff != "" {
		t.Errorf("phases (-want +got):\n%s", diff)
	}
	if got.Schema != Schema || got.Machine.CPUs < 1 {
		t.Errorf("schema %q, machine %+v", got.Schema, got.Machine)
	}
}
