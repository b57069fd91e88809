package main

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one run's samples.
type Summary struct {
	N    int           `json:"n"`
	Mean time.Duration `json:"mean_ns"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
}

// summarize sorts nothing in place: it works on a sorted copy of samples.
func summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Summary{
		N:    len(s),
		Mean: sum / time.Duration(len(s)),
		P50:  percentile(s, 50),
		P90:  percentile(s, 90),
		P99:  percentile(s, 99),
		Max:  s[len(s)-1],
	}
}

// percentile returns the nearest-rank p-th percentile of sorted, which must
// be sorted ascending: the smallest sample such that at least p% of samples
// are ≤ it. It returns 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// cdfPoints returns at most k points (latency, share ≤ latency) of the
// empirical CDF of sorted samples, evenly spaced in share, always including
// the minimum and the maximum.
func cdfPoints(sorted []time.Duration, k int) []cdfPoint {
	n := len(sorted)
	if n == 0 || k < 2 {
		return nil
	}
	if n <= k {
		pts := make([]cdfPoint, n)
		for i, d := range sorted {
			pts[i] = cdfPoint{d, float64(i+1) / float64(n)}
		}
		return pts
	}
	pts := make([]cdfPoint, 0, k)
	for j := range k {
		i := int(math.Round(float64(j) * float64(n-1) / float64(k-1)))
		pts = append(pts, cdfPoint{sorted[i], float64(i+1) / float64(n)})
	}
	return pts
}

type cdfPoint struct {
	D     time.Duration
	Share float64
}
