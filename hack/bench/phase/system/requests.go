package system

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// requestKey is one series of apiserver_request_total.
type requestKey struct{ resource, verb, subresource, code string }

// requestCounts are request counts per series, over n tasks.
type requestCounts map[requestKey]float64

// writeVerbs are the verb label values of write requests. The API server
// labels a request with its HTTP method (POST, PUT, PATCH, DELETE), and
// server-side apply as APPLY; the admission-style names are accepted too.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true,
	"APPLY": true, "CREATE": true, "UPDATE": true}

func isWrite(k requestKey) bool       { return writeVerbs[k.verb] }
func isTaskWrite(k requestKey) bool   { return isWrite(k) && k.resource == "bashtasks" }
func isStatusWrite(k requestKey) bool { return isTaskWrite(k) && k.subresource == "status" }

// apiRequests reads the API server's requests: writes on bashtasks, and for
// the breakdown the writes on every other resource (events, leases) and the
// reads (GET, LIST; a WATCH counts once, when it opens).
func (b *bench) apiRequests(ctx context.Context) (requestCounts, error) {
	raw, err := b.cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	wc := requestCounts{}
	seen := false
	for _, s := range parseMetric(raw, "apiserver_request_total") {
		resource := s.labels["resource"]
		if resource == "bashtasks" {
			if s.labels["group"] != v1.GroupVersion.Group {
				continue
			}
			seen = true
		}
		wc[requestKey{resource, s.labels["verb"], s.labels["subresource"], s.labels["code"]}] += s.value
	}
	if !seen {
		return nil, errors.New("the API server's /metrics has no apiserver_request_total series for bashtasks")
	}
	return wc, nil
}

func (w requestCounts) minus(before requestCounts) requestCounts {
	d := requestCounts{}
	for k, v := range w {
		if v-before[k] > 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

// perTask sums the matching series and divides by the number of tasks
// (setN).
func (w requestCounts) perTask(match func(requestKey) bool) float64 {
	n := w[requestKey{verb: "#tasks"}]
	var sum float64
	for k, v := range w {
		if k.verb != "#tasks" && match(k) {
			sum += v
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / n
}

// setN records the number of tasks under a key no series has.
func (w requestCounts) setN(n int) { w[requestKey{verb: "#tasks"}] = float64(n) }

func (w requestCounts) print() {
	n := w[requestKey{verb: "#tasks"}]
	fmt.Printf("API requests in the full-system windows (apiserver_request_total), %0.f tasks; writes_per_task counts writes on bashtasks only:\n", n)
	keys := make([]requestKey, 0, len(w))
	for k := range w {
		if k.verb != "#tasks" {
			keys = append(keys, k)
		}
	}
	others := func(k requestKey) int { // bashtask writes, other writes, then reads
		switch {
		case isTaskWrite(k):
			return 0
		case isWrite(k):
			return 1
		}
		return 2
	}
	slices.SortFunc(keys, func(a, b requestKey) int {
		return cmp.Or(cmp.Compare(others(a), others(b)), cmp.Compare(a.resource, b.resource), cmp.Compare(a.verb, b.verb), cmp.Compare(a.subresource, b.subresource), cmp.Compare(a.code, b.code))
	})
	tw := report.NewTable(os.Stdout, false)
	fmt.Fprintf(tw, "  resource\tverb\tsubresource\tcode\trequests\tper task\n")
	for _, k := range keys {
		sub := k.subresource
		if sub == "" {
			sub = "(object)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%.0f\t%.3f\n", k.resource, k.verb, sub, k.code, w[k], w[k]/n)
	}
	fmt.Fprintf(tw, "  writes on bashtasks, all\t\t\t\t\t%.3f\n", w.perTask(isTaskWrite))
	fmt.Fprintf(tw, "  writes on other resources, all\t\t\t\t\t%.3f\n", w.perTask(func(k requestKey) bool { return isWrite(k) && !isTaskWrite(k) }))
	fmt.Fprintf(tw, "  reads, all\t\t\t\t\t%.3f\n", w.perTask(func(k requestKey) bool { return !isWrite(k) }))
	_ = tw.Flush()
}

type sample struct {
	labels map[string]string
	value  float64
}

// parseMetric reads the samples of one metric from Prometheus text.
func parseMetric(raw []byte, name string) []sample {
	var out []sample
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		s := sample{labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			var ok bool
			rest, ok = parseLabels(rest[1:], s.labels)
			if !ok {
				continue
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// parseLabels reads `a="x",b="y"}` into m and returns what follows.
func parseLabels(s string, m map[string]string) (string, bool) {
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return s[1:], true
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", false
		}
		key := s[:eq]
		s = s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", false
		}
		m[key] = val.String()
		s = s[i+1:]
	}
}

// controllerMetricsURL finds the controller's metrics address in its
// command line; empty when it cannot.
func controllerMetricsURL(dir string) string {
	pid := readPID(filepath.Join(dir, "pids", "controller"))
	if pid == 0 {
		return ""
	}
	addr := flagValue(pid, "--metrics-bind-address")
	if addr == "" || addr == "0" {
		return ""
	}
	return "http://" + addr + "/metrics"
}

// scrapeController returns the controller's counters the benchmark reports,
// keyed by series: bashtask_status_writes_total per kind, and the
// reconciles, workqueue adds, and the sums and counts of the workqueue's
// queue and work durations of the bashtask controller. Nil when the
// controller's metrics cannot be read.
func scrapeController(ctx context.Context, url string) map[string]float64 {
	if url == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := httpGet(ctx, url)
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, s := range parseMetric(raw, "bashtask_status_writes_total") {
		out["status writes, "+s.labels["kind"]] += s.value
	}
	for _, s := range parseMetric(raw, "controller_runtime_reconcile_total") {
		if s.labels["controller"] == "bashtask" {
			out["reconciles, "+s.labels["result"]] += s.value
		}
	}
	for _, name := range []string{"workqueue_adds_total", "workqueue_retries_total",
		"workqueue_queue_duration_seconds_sum", "workqueue_queue_duration_seconds_count",
		"workqueue_work_duration_seconds_sum", "workqueue_work_duration_seconds_count"} {
		for _, s := range parseMetric(raw, name) {
			if s.labels["name"] == "bashtask" {
				out[name] += s.value
			}
		}
	}
	return out
}

// printController prints what the controller did in a phase of n tasks.
func printController(before, after map[string]float64, n int) {
	if before == nil || after == nil {
		return
	}
	d := func(k string) float64 { return after[k] - before[k] }
	fmt.Println("controller in the full-system windows (its /metrics), per task:")
	for _, k := range sortedKeys(after) {
		if strings.HasPrefix(k, "status writes, ") || strings.HasPrefix(k, "reconciles, ") {
			if v := d(k); v > 0 {
				fmt.Printf("  %-22s %6.0f  %.3f\n", k, v, v/float64(n))
			}
		}
	}
	if v := d("workqueue_adds_total"); v > 0 {
		fmt.Printf("  %-22s %6.0f  %.3f\n", "workqueue adds", v, v/float64(n))
	}
	if c := d("workqueue_queue_duration_seconds_count"); c > 0 {
		fmt.Printf("  mean wait in the workqueue %.1f ms, mean reconcile %.1f ms\n",
			1000*d("workqueue_queue_duration_seconds_sum")/c,
			1000*d("workqueue_work_duration_seconds_sum")/max(d("workqueue_work_duration_seconds_count"), 1))
	}
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// controllerRSS reads VmRSS and VmHWM of the controller in MiB.
func controllerRSS(dir string) (rss, hwm float64, pid int, err error) {
	raw, err := os.ReadFile(filepath.Join(dir, "pids", "controller"))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reading the controller's pid: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reading the controller's pid: %w", err)
	}
	m, err := procfs.ReadMemory(pid)
	if err != nil {
		return 0, 0, pid, fmt.Errorf("reading the controller's memory: %w", err)
	}
	return float64(m.RSS) / (1 << 20), float64(m.HWM) / (1 << 20), pid, nil
}
