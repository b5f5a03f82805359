package system

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
)

// printTable prints the table and returns whether a figure missed its target.
func printTable(o options, f figures) bool {
	type row struct {
		measure, figure, target string
		ok                      bool
		measured                bool
		noTarget                bool
	}
	var rows []row
	num := func(v float64, format string) string {
		if math.IsNaN(v) {
			return "not measured"
		}
		return fmt.Sprintf(format, v)
	}
	add := func(measure string, v float64, format, target string, ok bool) {
		rows = append(rows, row{measure: measure, figure: num(v, format), target: target, ok: ok, measured: !math.IsNaN(v)})
	}
	if f.executor != nil {
		plain := f.executor["executor.plain_write_mb_s"]
		add("executor.overhead_ratio", f.executor["executor.overhead_ratio"], "%.2f", "<= 1.30", f.executor["executor.overhead_ratio"] <= 1.30)
		add("executor.throughput_mb_s", f.executor["executor.throughput_mb_s"], "%.0f",
			fmt.Sprintf(">= 0.50 x plain write (%.0f)", plain), f.executor["executor.throughput_mb_s"] >= 0.5*plain)
		add("executor.rss_growth_mb", f.executor["executor.rss_growth_mb"], "%.1f", "< 32", f.executor["executor.rss_growth_mb"] < 32)
		if drain, ok := f.executor["executor.pipe_drain_mb_s"]; ok {
			add("executor.pipe_drain_mb_s", drain, "%.0f", "(the reference)", true)
			rows[len(rows)-1].noTarget = true
			target := ">= 0.75"
			if hash, ok := f.executor["executor.sha256_mb_s"]; ok && drain > 0 {
				// Every byte is hashed in order: the hash's speed bounds it.
				target += fmt.Sprintf(" (SHA-256 on one core: %.0f MB/s, %.2f)", hash, hash/drain)
			}
			add("executor.throughput_ratio", f.executor["executor.throughput_ratio"], "%.2f", target, f.executor["executor.throughput_ratio"] >= 0.75)
		}
		// The executor against the hash's own speed, measured in the same
		// rounds (issue 26): without and with a reader uploading the
		// spill file in parts behind the writer.
		for _, k := range []string{"executor.sha256_ratio", "executor.sha256_ratio_uploads"} {
			if v, ok := f.executor[k]; ok {
				add(k, v, "%.2f", ">= 0.90", v >= 0.90)
			}
		}
		if v, ok := f.executor["executor.stream_cpu_ms_per_gb"]; ok {
			add("executor.stream_cpu_ms_per_gb", v, "%.0f", fmt.Sprintf("(with part uploads: %.0f)", f.executor["executor.stream_cpu_ms_per_gb_uploads"]), true)
			rows[len(rows)-1].noTarget = true
		}
		if v, ok := f.executor["executor.tenant_task_cpu_ms"]; ok {
			add("executor.tenant_task_cpu_ms", v, "%.2f", fmt.Sprintf("(at the cgroup level: %.2f)", f.executor["executor.task_cpu_ms"]), true)
			rows[len(rows)-1].noTarget = true
		}
		// A task in a workspace against a plain tenant task of network
		// None (docs/workspaces.md): the median of the differences of the
		// pairs run in the same round.
		if v, ok := f.executor["executor.workspace_task_overhead_ms"]; ok {
			add("executor.workspace_task_overhead_ms", v, "%+.2f", fmt.Sprintf("<= +1.00 (against network Node: %+.2f)", f.executor["executor.workspace_task_overhead_node_ms"]), v <= 1)
		}
	}
	add("e2e.latency_p50_ms", f.latP50, "%.1f", "<= 30", f.latP50 <= 30)
	add("e2e.latency_p99_ms", f.latP99, "%.1f", "<= 150", f.latP99 <= 150)
	add("e2e.throughput_tasks_s", f.throughput, "%.1f", ">= 200", f.throughput >= 200)
	add("e2e.raw_api_tasks_s", f.raw, "%.1f", "(the reference)", true)
	rows[len(rows)-1].noTarget = true
	add("e2e.ratio_to_raw", f.ratio(), "%.2f", ">= 0.80", f.ratio() >= minRatioToRaw)
	add("e2e.ratio_to_raw_spread", f.ratioSpread(), "± %.2f", fmt.Sprintf("(over %d pairs)", len(f.ratios)), true)
	rows[len(rows)-1].noTarget = true
	add("e2e.apiserver_cpu_ms_per_task", f.apiCPU, "%.2f", "(raw API: "+num(f.rawAPICPU, "%.2f")+")", true)
	rows[len(rows)-1].noTarget = true
	add("e2e.writes_per_task", f.writesPerTask, "%.2f", "<= 3", f.writesPerTask <= 3)
	add("controller.rss_mb_10k", f.rssMB, "%.1f", fmt.Sprintf("< 300 (%d tasks)", o.rssTotal), f.rssMB < 300)
	add("workspace.create_ready_p50_ms", f.wsCreateP50, "%.1f", "<= 100 (p99 "+num(f.wsCreateP99, "%.1f")+")", f.wsCreateP50 <= 100)
	add("workspace.task_latency_p50_ms", f.wsTaskP50, "%.1f", "(plain task, same run: "+num(f.wsPlainP50, "%.1f")+")", true)
	rows[len(rows)-1].noTarget = true
	add("workspace.cp_download_mb_s", f.wsCopyMBps, "%.1f", ">= 50 (50 MiB, median of 3)", f.wsCopyMBps >= 50)
	if f.output != nil {
		out := func(k string) float64 {
			if v, ok := f.output[k]; ok {
				return v
			}
			return math.NaN()
		}
		add("output.latency_p50_ms", out("output.latency_p50_ms"), "%.1f", "<= 50", out("output.latency_p50_ms") <= 50)
		add("output.latency_p99_ms", out("output.latency_p99_ms"), "%.1f", "<= 250", out("output.latency_p99_ms") <= 250)
		add("output.throughput_mb_s", out("output.throughput_mb_s"), "%.0f", ">= 100 (one follower)", out("output.throughput_mb_s") >= 100)
		followers := fmt.Sprintf("%.0f followers of %.0f running tasks", out("output.followers"), out("output.followed_tasks"))
		add("output.followers_controller_rss_mb", out("output.followers_controller_rss_mb"), "%.1f", "< 300 ("+followers+")",
			out("output.followers_controller_rss_mb") < 300)
		add("output.followers_agent_rss_mb", out("output.followers_agent_rss_mb"), "%.1f", "(the agent, "+followers+")", true)
		rows[len(rows)-1].noTarget = true
		add("output.followers_latency_p50_ms", out("output.followers_latency_p50_ms"), "%.1f",
			"(p99 "+num(out("output.followers_latency_p99_ms"), "%.1f")+")", true)
		rows[len(rows)-1].noTarget = true
	}
	if f.resume != nil {
		res := func(k string) float64 {
			if v, ok := f.resume[k]; ok {
				return v
			}
			return math.NaN()
		}
		p50 := res("resume.first_task_p50_ms")
		add("resume.first_task_p50_ms", p50, "%.0f", fmt.Sprintf("<= 2000 (%.0f MiB; p90 %s, max %s, %.0f rounds)", res("resume.data_mib"),
			num(res("resume.first_task_p90_ms"), "%.0f"), num(res("resume.first_task_max_ms"), "%.0f"), res("resume.rounds")), p50 <= 2000)
	}

	if f.session != nil {
		ses := func(k string) float64 {
			if v, ok := f.session[k]; ok {
				return v
			}
			return math.NaN()
		}
		created := "create→terminal " + num(ses("session.create_terminal_p50_ms"), "%.1f")
		add("session.plugin_run_p50_ms", ses("session.plugin_run_p50_ms"), "%.1f", "<= 60 (kubectl-bashtask run -w W -- true; "+created+")",
			ses("session.plugin_run_p50_ms") <= 60)
		add("session.client_run_p50_ms", ses("session.client_run_p50_ms"), "%.1f", "<= 30 (the Go client's Run of true in W; "+created+")",
			ses("session.client_run_p50_ms") <= 30)
	}

	fmt.Printf("\n== bashtask benchmark: %d CPUs, load average %s at start, %s at end\n", runtime.NumCPU(), f.loadStart, f.loadE)
	tw := report.NewTable(os.Stdout, false)
	fmt.Fprintf(tw, "measure\tfigure\ttarget\t\n")
	miss := false
	for _, r := range rows {
		verdict := "ok"
		switch {
		case !r.measured:
			verdict = "-"
		case r.noTarget:
			verdict = ""
		case !r.ok:
			verdict, miss = "MISS", true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.measure, r.figure, r.target, verdict)
	}
	_ = tw.Flush()
	return miss
}

// figuresOf are the phase's figures: the system's, and those of the other
// phases the table takes in, under their own keys.
func figuresOf(f figures) phase.Figures {
	m := phase.Figures{}
	if f.executor != nil {
		for _, k := range []string{"executor.overhead_ratio", "executor.throughput_mb_s", "executor.rss_growth_mb", "executor.pipe_drain_mb_s", "executor.throughput_ratio",
			"executor.sha256_mb_s", "executor.sha256_ratio", "executor.sha256_ratio_uploads", "executor.throughput_uploads_mb_s",
			"executor.stream_cpu_ms_per_gb", "executor.stream_cpu_ms_per_gb_uploads", "executor.task_cpu_ms", "executor.tenant_task_cpu_ms",
			"executor.workspace_task_overhead_ms", "executor.workspace_task_overhead_node_ms", "executor.workspace_create_disk_ms"} {
			if v, ok := f.executor[k]; ok {
				m[k] = v
			}
		}
	}
	put := func(k string, v float64) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m[k] = math.Round(v*100) / 100
		}
	}
	put("e2e.latency_p50_ms", f.latP50)
	put("e2e.latency_p99_ms", f.latP99)
	put("e2e.throughput_tasks_s", f.throughput)
	put("e2e.raw_api_tasks_s", f.raw)
	put("e2e.ratio_to_raw", f.ratio())
	put("e2e.ratio_to_raw_spread", f.ratioSpread())
	put("e2e.apiserver_cpu_ms_per_task", f.apiCPU)
	put("e2e.raw_apiserver_cpu_ms_per_task", f.rawAPICPU)
	put("e2e.writes_per_task", f.writesPerTask)
	put("controller.rss_mb_10k", f.rssMB)
	put("workspace.create_ready_p50_ms", f.wsCreateP50)
	put("workspace.create_ready_p99_ms", f.wsCreateP99)
	put("workspace.task_latency_p50_ms", f.wsTaskP50)
	put("workspace.plain_task_latency_p50_ms", f.wsPlainP50)
	put("workspace.cp_download_mb_s", f.wsCopyMBps)
	for _, k := range outputKeys {
		if v, ok := f.output[k]; ok {
			put(k, v)
		}
	}
	for _, k := range resumeKeys {
		if v, ok := f.resume[k]; ok {
			put(k, v)
		}
	}
	for k, v := range f.session {
		put(k, v)
	}
	return m
}

// outputKeys are the figures of the output phase that the table and the
// JSON take over.
var outputKeys = []string{"output.latency_p50_ms", "output.latency_p99_ms", "output.throughput_mb_s",
	"output.followers", "output.followed_tasks", "output.followers_controller_rss_mb", "output.followers_agent_rss_mb",
	"output.followers_latency_p50_ms", "output.followers_latency_p99_ms"}

// resumeKeys are the figures of the resume phase that the JSON takes
// over; the table shows the first of them.
var resumeKeys = []string{"resume.first_task_p50_ms", "resume.first_task_p90_ms", "resume.first_task_max_ms",
	"resume.restore_p50_ms", "resume.data_mib", "resume.rounds"}

// joinFloats formats xs with format, comma-separated.
func joinFloats(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}

// reportLogErrors prints how many error lines each component logged, and
// the first few.
func reportLogErrors(dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		raw, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		var errs []string
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, "level=ERROR") || strings.Contains(line, `"level":"error"`) || strings.Contains(line, "\tERROR\t") {
				errs = append(errs, line)
			}
		}
		if len(errs) == 0 {
			continue
		}
		fmt.Printf("%s: %d error lines, first ones:\n", filepath.Base(l), len(errs))
		for _, e := range errs[:min(len(errs), 3)] {
			if len(e) > 300 {
				e = e[:300] + "…"
			}
			fmt.Printf("  %s\n", e)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
