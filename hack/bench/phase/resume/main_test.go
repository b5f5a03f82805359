package resume

import (
	"bytes"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// agentLog is what the agent's text logger (--log-format text) writes
// for a snapshot and a restore, with the attributes of
// executor/agent/workspace_snapshot.go.
func agentLog(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	key := "workspaces/bench-resume/resume/0b8e/2-1764645000000000000.tar.zst"
	log.Info("workspace snapshot written", "workspace", "0b8e", "key", key, "bytes", 70000000,
		"dataBytes", 104857600, "files", 3033, "changed", 0, "runningTasks", 0, "took", 1234*time.Millisecond)
	log.Info("workspace restored", "workspace", "0b8e", "key", "workspaces/bench-resume/resume/0b8e/1-1764644000000000000.tar.zst",
		"bytes", 70000000, "files", 3033, "took", 800*time.Millisecond)
	log.Info("workspace restored", "workspace", "0b8e", "key", key, "bytes", 70000000, "files", 3033, "took", 912*time.Millisecond)
	return buf.String()
}

func TestFindTook(t *testing.T) {
	log := agentLog(t)
	key := "workspaces/bench-resume/resume/0b8e/2-1764645000000000000.tar.zst"
	tests := map[string]struct {
		msg, key string
		want     time.Duration
		found    bool
	}{
		"snapshot":                 {msg: "workspace snapshot written", key: key, want: 1234 * time.Millisecond, found: true},
		"restore of that snapshot": {msg: "workspace restored", key: key, want: 912 * time.Millisecond, found: true},
		"another object":           {msg: "workspace restored", key: key + "x", found: false},
		"another message":          {msg: "workspace made", key: key, found: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, found := findTook(log, tc.msg, tc.key)
			if found != tc.found || got != tc.want {
				t.Errorf("findTook(%q, %q) = %v, %v; want %v, %v\nlog:\n%s", tc.msg, tc.key, got, found, tc.want, tc.found, log)
			}
		})
	}
}

func TestEpochRealtime(t *testing.T) {
	tests := map[string]struct {
		in   string
		want time.Time
		err  bool
	}{
		"microseconds": {in: "1764645000.123456", want: time.Unix(1764645000, 123456000)},
		"short":        {in: "1764645000.5", want: time.Unix(1764645000, 500000000)},
		"no fraction":  {in: "1764645000", err: true},
		"a comma":      {in: "1764645000,123456", err: true},
		"empty":        {in: "", err: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := epochRealtime(tc.in)
			if (err != nil) != tc.err || (!tc.err && !got.Equal(tc.want)) {
				t.Errorf("epochRealtime(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{900, 1500, 1100, 2500, 1000, 1200, 1300, 1400, 1600, 3000}
	for p, want := range map[float64]float64{0.5: 1300, 0.9: 2500, 1: 3000} {
		if got := stats.Percentile(xs, p); got != want {
			t.Errorf("percentile(p%.0f) = %v, want %v", p*100, got, want)
		}
	}
	if got := stats.Percentile(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("percentile of none = %v, want NaN", got)
	}
	if !strings.Contains(sec(1234), "1.23s") || sec(math.NaN()) != "-" {
		t.Errorf("sec: %q, %q", sec(1234), sec(math.NaN()))
	}
}
