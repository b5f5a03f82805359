// Package report is what hack/bench prints and writes for every phase: the
// tables (Table) and the one JSON file with a section per phase
// (Document).
package report

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
)

// Schema names the layout of Document; it changes when a field's meaning
// does.
const Schema = "bashtask-bench/v1"

// Document is the JSON file of a run:
//
//	{
//	  "schema": "bashtask-bench/v1",
//	  "machine": {"cpus": 2, "load_start": "0.52 0.61 0.70", "load_end": "..."},
//	  "phases": {
//	    "executor": {"executor.overhead_ratio": 1.08, ...},
//	    "system": {"e2e.latency_p50_ms": 12.3, ..., "executor.overhead_ratio": 1.08, ...}
//	  }
//	}
//
// Each section holds the figures of one phase by their keys, the same keys
// the former per-program files held (docs/performance.md); the system's
// section also repeats the other phases' figures its table shows, as the
// former _output/bench.json did. A figure not measured is left out;
// numbers are rounded to two decimals.
type Document struct {
	// Schema is Schema.
	Schema string `json:"schema"`
	// Machine describes where the run took place.
	Machine Machine `json:"machine"`
	// Phases holds each phase's figures by phase name.
	Phases map[string]phase.Figures `json:"phases"`
}

// Machine is the machine of a run.
type Machine struct {
	// CPUs is runtime.NumCPU.
	CPUs int `json:"cpus"`
	// LoadStart and LoadEnd are /proc/loadavg's three load averages at the
	// start and at the end of the run.
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

// NewDocument returns an empty document of this machine, its load
// average taken now.
func NewDocument() *Document {
	return &Document{Schema: Schema, Machine: Machine{CPUs: runtime.NumCPU(), LoadStart: phase.LoadAvg()},
		Phases: map[string]phase.Figures{}}
}

// Add sets the section of a phase to f, without the figures that are NaN
// or infinite, each rounded to two decimals.
func (d *Document) Add(name string, f phase.Figures) {
	s := phase.Figures{}
	for k, v := range f {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			s[k] = math.Round(v*100) / 100
		}
	}
	d.Phases[name] = s
}

// Write writes the document to path, indented, making its directory.
func (d *Document) Write(path string) error {
	raw, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}
