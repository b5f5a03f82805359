package stats

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"empty", nil, math.NaN()},
		{"one", []float64{7}, 7},
		{"two: mean of both", []float64{4, 1}, 2.5},
		{"odd: the middle", []float64{3, 1, 2}, 2},
		{"even: mean of the middle two", []float64{10, 1, 4, 3}, 3.5},
		{"duplicates", []float64{5, 5, 1, 5}, 5},
		{"negatives", []float64{-3, -1, -2}, -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.xs...)
			if diff := cmp.Diff(tc.want, Median(tc.xs), cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("Median(%v) (-want +got):\n%s", tc.xs, diff)
			}
			if diff := cmp.Diff(in, tc.xs); diff != "" {
				t.Errorf("Median changed its input (-before +after):\n%s", diff)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	ten := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	for _, tc := range []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"empty", nil, 0.5, math.NaN()},
		{"one, p=0", []float64{7}, 0, 7},
		{"one, p=1", []float64{7}, 1, 7},
		{"p=0 is the minimum", ten, 0, 1},
		{"p=1 is the maximum", ten, 1, 10},
		{"p50 of an even count is the lower middle", ten, 0.5, 5},
		{"p50 of an odd count is the middle", []float64{3, 1, 2}, 0.5, 2},
		{"p90 of ten", ten, 0.9, 9},
		{"p99 of ten is the maximum", ten, 0.99, 10},
		{"p25 of four", []float64{4, 3, 2, 1}, 0.25, 1},
		{"p26 of four rounds up", []float64{4, 3, 2, 1}, 0.26, 2},
		{"p above 1 is clamped", ten, 1.5, 10},
		{"p below 0 is clamped", ten, -1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Percentile(tc.xs, tc.p), cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("Percentile(%v, %v) (-want +got):\n%s", tc.xs, tc.p, diff)
			}
		})
	}
}

// TestPercentileWholeRanks checks that p·n landing on a whole number picks
// that rank though the float product is a hair above it.
func TestPercentileWholeRanks(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	got := map[float64]float64{}
	for _, p := range []float64{0.01, 0.29, 0.5, 0.57, 0.9, 0.99} {
		got[p] = Percentile(xs, p)
	}
	want := map[float64]float64{0.01: 1, 0.29: 29, 0.5: 50, 0.57: 57, 0.9: 90, 0.99: 99}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("percentiles of 1..100 (-want +got):\n%s", diff)
	}
}

func TestDurations(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name           string
		ds             []time.Duration
		median, p0     time.Duration
		p50, p90, p100 time.Duration
	}{
		{"empty", nil, 0, 0, 0, 0, 0},
		{"odd", []time.Duration{3 * ms, 1 * ms, 2 * ms}, 2 * ms, 1 * ms, 2 * ms, 3 * ms, 3 * ms},
		{"even", []time.Duration{4 * ms, 1 * ms, 3 * ms, 2 * ms}, 2500 * time.Microsecond, 1 * ms, 2 * ms, 4 * ms, 4 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := []time.Duration{MedianDuration(tc.ds), PercentileDuration(tc.ds, 0), PercentileDuration(tc.ds, 0.5),
				PercentileDuration(tc.ds, 0.9), PercentileDuration(tc.ds, 1)}
			want := []time.Duration{tc.median, tc.p0, tc.p50, tc.p90, tc.p100}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("median, p0, p50, p90, p100 of %v (-want +got):\n%s", tc.ds, diff)
			}
		})
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, math.NaN()},
		{[]float64{2}, 0},
		{[]float64{0.9, 0.7, 0.8}, 0.1},
	} {
		if diff := cmp.Diff(tc.want, Spread(tc.xs), cmpopts.EquateNaNs(), cmpopts.EquateApprox(0, 1e-12)); diff != "" {
			t.Errorf("Spread(%v) (-want +got):\n%s", tc.xs, diff)
		}
	}
}
