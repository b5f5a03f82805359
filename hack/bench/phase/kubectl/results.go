package kubectl

import (
	"fmt"
	"os"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// The targets (docs/performance.md): the echo's in milliseconds, the
// throughput's as a share of kubectl port-forward's.
const (
	targetEchoP50Ms      = 10
	targetEchoP99Ms      = 50
	targetThroughputRate = 0.5
)

// pfFigures are one port-forward's figures: MiB/s through one connection,
// requests per second on kept and on new connections.
type pfFigures struct{ mibs, rps, cps float64 }

// results are both sides' figures, the workspace's at index 0 and the
// pod's at 1: keystroke echo latencies in milliseconds and the
// port-forward figures.
type results struct {
	echo [2][]float64
	pf   [2]pfFigures
}

// row is one line of the table: a figure of both sides, their ratio
// (bashtask / kubectl) and the target's verdict.
type row struct {
	name, unit   string
	ours, theirs float64
	target       string
}

func (r *results) rows() []row {
	p := func(i int, q float64) float64 { return stats.Percentile(r.echo[i], q) }
	verdict := func(ok bool, s string) string {
		if ok {
			return s + ": ok"
		}
		return s + ": MISS"
	}
	return []row{
		{"keystroke echo p50", "ms", p(0, 0.5), p(1, 0.5), verdict(p(0, 0.5) <= targetEchoP50Ms, fmt.Sprintf("<= %d ms", targetEchoP50Ms))},
		{"keystroke echo p99", "ms", p(0, 0.99), p(1, 0.99), verdict(p(0, 0.99) <= targetEchoP99Ms, fmt.Sprintf("<= %d ms", targetEchoP99Ms))},
		{"throughput, one connection", "MiB/s", r.pf[0].mibs, r.pf[1].mibs,
			verdict(r.pf[0].mibs >= targetThroughputRate*r.pf[1].mibs, fmt.Sprintf(">= %.1f of kubectl", targetThroughputRate))},
		{"small HTTP GETs, keep-alive", "req/s", r.pf[0].rps, r.pf[1].rps, ""},
		{"small HTTP GETs, new connection each", "req/s", r.pf[0].cps, r.pf[1].cps, ""},
	}
}

// print prints the table and returns the figures.
func (r *results) print(o options) phase.Figures {
	fmt.Printf("\n== terminal and port-forward on the one-node cluster: bashtask (workspace) against kubectl (pod on the same node); load average %s\n", phase.LoadAvg())
	fmt.Printf("   echo: %d keys, one at a time; port-forward: %d MiB through one connection, GETs of a 3-byte file with %d in flight\n",
		o.keys, o.bytes>>20, o.concurrency)
	tw := report.NewTable(os.Stdout, false)
	tw.Row("figure", "unit", "bashtask", "kubectl", "ratio", "target")
	for _, x := range r.rows() {
		tw.Rowf("%s\t%s\t%.2f\t%.2f\t%.2f\t%s", x.name, x.unit, x.ours, x.theirs, x.ours/x.theirs, x.target)
	}
	_ = tw.Flush()
	return phase.Figures{
		"kubectl.echo_p50_ms":                  stats.Percentile(r.echo[0], 0.5),
		"kubectl.echo_p99_ms":                  stats.Percentile(r.echo[0], 0.99),
		"kubectl.exec_echo_p50_ms":             stats.Percentile(r.echo[1], 0.5),
		"kubectl.exec_echo_p99_ms":             stats.Percentile(r.echo[1], 0.99),
		"kubectl.throughput_mib_s":             r.pf[0].mibs,
		"kubectl.kubectl_throughput_mib_s":     r.pf[1].mibs,
		"kubectl.throughput_ratio":             r.pf[0].mibs / r.pf[1].mibs,
		"kubectl.http_requests_per_s":          r.pf[0].rps,
		"kubectl.kubectl_http_requests_per_s":  r.pf[1].rps,
		"kubectl.http_new_connections_per_s":   r.pf[0].cps,
		"kubectl.kubectl_http_new_conns_per_s": r.pf[1].cps,
	}
}
