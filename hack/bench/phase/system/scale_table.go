package system

import (
	"fmt"
	"math"
	"os"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
)

// printScaleTable prints one row per point and the cost-per-task ratios
// of the largest point to the smallest.
func printScaleTable(rows []scaleRow) {
	fmt.Println("\n== scale: one row per point (real: bashtask-agent processes; sim: simulated agents in the harness, whose CPU is not the agents')")
	t := report.NewTable(os.Stdout, false)
	t.Row("point", "agents", "tasks", "workspaces", "tasks/s", "p50 ms", "p99 ms", "ctrl CPU ms/task", "writes/task", "ctrl RSS MiB",
		"apiserver CPU ms/task", "etcd CPU ms/task", "etcd db MiB", "leader start→dispatch s", "node loss→NodeLost s")
	for _, r := range rows {
		kind := "real"
		if r.point.simulated {
			kind = "sim"
		}
		t.Row(r.point.String(), fmt.Sprintf("%d %s", r.point.agents, kind), fmt.Sprint(r.point.tasks), fmt.Sprint(r.workspaces),
			cell(r.tps, 1), cell(r.p50, 0), cell(r.p99, 0), cell(r.ctrlCPUms, 2), cell(r.writes, 2), cell(r.rssMiB, 0),
			cell(r.apiCPUms, 2), cell(r.etcdCPUms, 2), cell(r.etcdDBMiB, 1), cell(r.leaderDispatchS, 2), cell(r.nodeLostS, 1))
	}
	_ = t.Flush()
	small, large, ok := extremes(rows)
	if !ok {
		return
	}
	fmt.Printf("cost per task, largest point (%s) / smallest (%s): controller CPU %s, apiserver CPU %s, etcd CPU %s, writes %s (target: within 1.5)\n",
		large.point, small.point, cell(large.ctrlCPUms/small.ctrlCPUms, 2), cell(large.apiCPUms/small.apiCPUms, 2),
		cell(large.etcdCPUms/small.etcdCPUms, 2), cell(large.writes/small.writes, 2))
}

// extremes are the points with the fewest and the most tasks (agents
// break a tie) among rows that measured their tasks.
func extremes(rows []scaleRow) (small, large scaleRow, ok bool) {
	size := func(r scaleRow) int { return r.point.tasks*1000 + r.point.agents }
	n := 0
	for _, r := range rows {
		if math.IsNaN(r.ctrlCPUms) {
			continue
		}
		if n == 0 || size(r) < size(small) {
			small = r
		}
		if n == 0 || size(r) > size(large) {
			large = r
		}
		n++
	}
	return small, large, n >= 2
}

func cell(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// scaleFigures are the rows' figures under scale.<point>.<figure>, and the
// ratios under scale.ratio.<figure>.
func scaleFigures(rows []scaleRow) phase.Figures {
	m := phase.Figures{}
	put := func(k string, v float64) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m[k] = math.Round(v*1000) / 1000
		}
	}
	for _, r := range rows {
		p := "scale." + r.point.String() + "."
		sim := 0.0
		if r.point.simulated {
			sim = 1
		}
		put(p+"agents", float64(r.point.agents))
		put(p+"simulated", sim)
		put(p+"tasks", float64(r.point.tasks))
		put(p+"workspaces", float64(r.workspaces))
		put(p+"workspaces_ready_s", r.wsReadyS)
		put(p+"tasks_s", r.tps)
		put(p+"latency_p50_ms", r.p50)
		put(p+"latency_p99_ms", r.p99)
		put(p+"controller_cpu_ms_per_task", r.ctrlCPUms)
		put(p+"writes_per_task", r.writes)
		put(p+"controller_rss_mb", r.rssMiB)
		put(p+"apiserver_cpu_ms_per_task", r.apiCPUms)
		put(p+"etcd_cpu_ms_per_task", r.etcdCPUms)
		put(p+"etcd_db_mb", r.etcdDBMiB)
		put(p+"leader_start_to_dispatch_s", r.leaderDispatchS)
		put(p+"node_loss_to_nodelost_s", r.nodeLostS)
	}
	if small, large, ok := extremes(rows); ok {
		put("scale.ratio.controller_cpu_per_task", large.ctrlCPUms/small.ctrlCPUms)
		put("scale.ratio.apiserver_cpu_per_task", large.apiCPUms/small.apiCPUms)
		put("scale.ratio.etcd_cpu_per_task", large.etcdCPUms/small.etcdCPUms)
		put("scale.ratio.writes_per_task", large.writes/small.writes)
	}
	return m
}
