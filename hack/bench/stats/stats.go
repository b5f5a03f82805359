// Package stats holds the statistics every phase of hack/bench prints:
// one median and one percentile definition for all of them.
//
//   - Median is the middle value of an odd count and the mean of the two
//     middle values of an even count.
//   - Percentile is the nearest-rank percentile: the smallest value such
//     that at least p·n of the n values are at or below it, that is the
//     ceil(p·n)-th smallest (1-based), clamped to the first and the last.
//     Percentile(xs, 0) is the minimum and Percentile(xs, 1) the maximum;
//     there is no interpolation, so every percentile is a measured value.
//
// Before the phases shared this package, hack/bench-executor took the
// upper of the two middle values as the median of an even count, and
// hack/bench-output and hack/bench-workspace took the value at 0-based
// index floor(p·n) as the p-percentile. Both differ from the definitions
// above by at most one rank, and only when the count is even (the median)
// or p·n is a whole number (the percentile): with the hundreds of samples
// those figures are taken over, the printed figures keep their meaning and
// stay comparable with earlier runs.
package stats

import (
	"math"
	"slices"
	"time"
)

// Median returns the median of xs (the mean of the middle two for an even
// count), NaN for none. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Percentile returns the nearest-rank p-percentile of xs, p in [0, 1]
// (0.99 for p99), NaN for none. xs is not modified.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[rank(len(s), p)]
}

// MedianDuration is Median for durations, 0 for none.
func MedianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// PercentileDuration is Percentile for durations, 0 for none.
func PercentileDuration(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[rank(len(s), p)]
}

// rank is the 0-based index of the nearest-rank p-percentile of n sorted
// values. The small slack keeps a p·n that is a whole number but comes
// out of the float multiplication a hair above it (0.29·100) on its rank.
func rank(n int, p float64) int {
	i := int(math.Ceil(p*float64(n)-1e-9)) - 1
	return min(max(i, 0), n-1)
}

// Spread is half the range of xs (its maximum minus its minimum, halved):
// a figure m is printed as m ± Spread. NaN for none.
func Spread(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return (slices.Max(xs) - slices.Min(xs)) / 2
}
