package system

import (
	"math"
	"testing"
	"time"
)

func TestRatioOfPairs(t *testing.T) {
	tests := map[string]struct {
		ratios     []float64
		wantMedian float64
		wantSpread float64
	}{
		"no pairs":      {ratios: nil, wantMedian: math.NaN(), wantSpread: math.NaN()},
		"one pair":      {ratios: []float64{0.7}, wantMedian: 0.7, wantSpread: 0},
		"odd count":     {ratios: []float64{0.78, 0.53, 0.73, 0.60, 0.74}, wantMedian: 0.73, wantSpread: 0.125},
		"even count":    {ratios: []float64{0.9, 0.6, 0.8, 0.7}, wantMedian: 0.75, wantSpread: 0.15},
		"outlier stays": {ratios: []float64{0.75, 0.76, 0.1}, wantMedian: 0.75, wantSpread: 0.33},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := figures{ratios: tc.ratios}
			if got := f.ratio(); !near(got, tc.wantMedian) {
				t.Errorf("ratio() = %v, want %v", got, tc.wantMedian)
			}
			if got := f.ratioSpread(); !near(got, tc.wantSpread) {
				t.Errorf("ratioSpread() = %v, want %v", got, tc.wantSpread)
			}
		})
	}
}

func TestCPUTotalAddsWindows(t *testing.T) {
	at := time.Unix(1000, 0)
	snap := func(offset time.Duration, cpu map[string]time.Duration) cpuSnapshot {
		return cpuSnapshot{at: at.Add(offset), cpu: cpu}
	}
	var total cpuTotal
	total.add(snap(0, map[string]time.Duration{"kube-apiserver": time.Second, "etcd": 0}),
		snap(2*time.Second, map[string]time.Duration{"kube-apiserver": 2 * time.Second, "etcd": 100 * time.Millisecond}))
	// A component that appears only in the second snapshot of a window
	// (it restarted) is not counted for that window.
	total.add(snap(10*time.Second, map[string]time.Duration{"kube-apiserver": 5 * time.Second}),
		snap(13*time.Second, map[string]time.Duration{"kube-apiserver": 6500 * time.Millisecond, "etcd": 50 * time.Millisecond}))
	if total.wall != 5*time.Second {
		t.Errorf("wall = %v, want 5s", total.wall)
	}
	if got := total.msPerTask("kube-apiserver", 100); !near(got, 25) {
		t.Errorf("kube-apiserver ms per task = %v, want 25 (2.5 s over 100 tasks)", got)
	}
	if got := total.msPerTask("etcd", 100); !near(got, 1) {
		t.Errorf("etcd ms per task = %v, want 1", got)
	}
	if got := total.msPerTask("controller", 100); !math.IsNaN(got) {
		t.Errorf("ms per task of a component never seen = %v, want NaN", got)
	}
	if got := idleCores(total, "etcd"); !near(got, 0.5) {
		t.Errorf("idleCores without etcd = %v, want 0.5 (2.5 s over 5 s)", got)
	}
}

func near(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) < 1e-9
}
