package agent_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// TestProbesAndMetrics checks the plain-HTTP endpoints of the binary: the
// kubelet probes and the Prometheus metrics after one task.
func TestProbesAndMetrics(t *testing.T) {
	p := newPKI(t)
	health := "127.0.0.1:" + strconv.Itoa(freePort(t))
	metrics := "127.0.0.1:" + strconv.Itoa(freePort(t))
	a := startAgent(t, p, filepath.Join(t.TempDir(), "state"), "file://"+t.TempDir(), nil,
		"--health-probe-address", health, "--metrics-address", metrics)
	c := a.client(t, p)
	w := watch(t, c)
	if _, err := c.Start(t.Context(), &agentv1.StartRequest{Spec: &agentv1.TaskSpec{
		Ref: &agentv1.TaskRef{Namespace: "ns", Name: "m", Uid: "metrics-1"}, Command: "echo out; echo err >&2",
	}}); err != nil {
		t.Fatal(err)
	}
	w.until("metrics-1", 20*time.Second, "finish", isType(agentv1.EventType_EVENT_TYPE_FINISHED))

	get := func(url string) (int, string) {
		t.Helper()
		var code int
		var body string
		err := poll(10*time.Second, func() error {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("%w: %w", errNotYet, err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			code, body = resp.StatusCode, string(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	healthz, _ := get("http://" + health + "/healthz")
	readyz, _ := get("http://" + health + "/readyz")
	// The uploads of the finished task may still be under way (the
	// backlog counts them until they end): read until every line is
	// there, or the poll's time is up.
	var found []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := get("http://" + metrics + "/metrics")
		found = found[:0]
		complete := true
		for _, want := range []string{
			`bashtask_agent_tasks_finished_total{reason="Succeeded"} 1`,
			`bashtask_agent_output_bytes_total{stream="stdout"} 4`,
			`bashtask_agent_output_bytes_total{stream="stderr"} 4`,
			`bashtask_agent_running_tasks 0`,
			`bashtask_agent_upload_backlog 0`,
		} {
			if strings.Contains(body, want+"\n") {
				found = append(found, want)
			} else {
				found = append(found, "missing: "+want)
				complete = false
			}
		}
		if complete || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := map[string]any{"healthz": healthz, "readyz": readyz, "metrics": found}
	want := map[string]any{"healthz": 200, "readyz": 200, "metrics": []string{
		`bashtask_agent_tasks_finished_total{reason="Succeeded"} 1`,
		`bashtask_agent_output_bytes_total{stream="stdout"} 4`,
		`bashtask_agent_output_bytes_total{stream="stderr"} 4`,
		`bashtask_agent_running_tasks 0`,
		`bashtask_agent_upload_backlog 0`,
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("probes and metrics (-want +got):\n%s", diff)
	}
}
