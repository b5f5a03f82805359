package system

import (
	"math"
	"testing"

	"k8s.io/utils/ptr"
)

// TestParsePoints: real and simulated points, and the error that names
// the flag and the limits.
func TestParsePoints(t *testing.T) {
	got, err := parsePoints("2:1000, 100sim:100000")
	if err != nil {
		t.Fatal(err)
	}
	want := []scalePoint{{agents: 2, tasks: 1000}, {agents: 100, simulated: true, tasks: 100000}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("parsePoints = %+v, want %+v", got, want)
	}
	if got[1].String() != "100sim-100k" || got[0].String() != "2real-1k" {
		t.Fatalf("names %q, %q", got[0], got[1])
	}
	for _, bad := range []string{"", "2", "0:10", "251sim:10", "2:0", "x:1"} {
		if _, err := parsePoints(bad); err == nil {
			t.Errorf("parsePoints(%q) accepted", bad)
		}
	}
}

// TestTaskSpecMix: every 10th task long, every 10th in a workspace, round
// robin; none in a workspace without workspaces.
func TestTaskSpecMix(t *testing.T) {
	o := scaleOptions{longEvery: 10, longSeconds: 2, wsEvery: 10}
	ws := []string{"a", "b"}
	var long, inWS int
	for i := range 100 {
		s := taskSpec(o, i, ws)
		if s.Command == "sleep 2" {
			long++
		} else if s.Command != "true" {
			t.Fatalf("task %d: command %q", i, s.Command)
		}
		if s.Workspace != nil {
			inWS++
		}
	}
	if long != 10 || inWS != 10 {
		t.Fatalf("%d long and %d in a workspace of 100, want 10 and 10", long, inWS)
	}
	if got := ptr.Deref(taskSpec(o, 10, ws).Workspace, ""); got != "b" {
		t.Fatalf("task 10 in workspace %q, want b", got)
	}
	if taskSpec(o, 0, nil).Workspace != nil {
		t.Fatal("a task in a workspace without workspaces")
	}
}

// TestExtremesSkipUnmeasured: the ratio is the largest measured point over
// the smallest; a point that failed before its figures does not count.
func TestExtremesSkipUnmeasured(t *testing.T) {
	rows := []scaleRow{newRow(scalePoint{agents: 2, tasks: 1000}), newRow(scalePoint{agents: 10, tasks: 10000}),
		newRow(scalePoint{agents: 100, simulated: true, tasks: 100000})}
	rows[0].ctrlCPUms, rows[1].ctrlCPUms = 2, 3
	small, large, ok := extremes(rows)
	if !ok || small.point.tasks != 1000 || large.point.tasks != 10000 {
		t.Fatalf("extremes = %v, %v, %v", small.point, large.point, ok)
	}
	f := scaleFigures(rows)
	if v := f["scale.ratio.controller_cpu_per_task"]; math.Abs(v-1.5) > 1e-9 {
		t.Fatalf("ratio %v, want 1.5", v)
	}
	if _, ok := f["scale.100sim-100k.tasks_s"]; ok {
		t.Fatal("a figure not measured is in the JSON")
	}
}
