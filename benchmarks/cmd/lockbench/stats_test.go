package main

import (
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	cases := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample", ms(7), 99, 7 * time.Millisecond},
		{"p50 of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p90 of 1..100", hundred, 90, 90 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p100 is the max", hundred, 100, 100 * time.Millisecond},
		{"p0 is the min", hundred, 0, 1 * time.Millisecond},
		{"p50 of four rounds down to the 2nd", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p51 of four is the 3rd", ms(1, 2, 3, 4), 51, 3 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v; want %v", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	in := ms(5, 1, 4, 2, 3)
	got := summarize(in)
	want := Summary{N: 5, Mean: 3 * time.Millisecond, P50: 3 * time.Millisecond, P90: 5 * time.Millisecond, P99: 5 * time.Millisecond, Max: 5 * time.Millisecond}
	if got != want {
		t.Errorf("summarize(%v) = %+v; want %+v", in, got, want)
	}
	if in[0] != 5*time.Millisecond {
		t.Errorf("summarize sorted its input in place: %v", in)
	}
	if got := summarize(nil); got != (Summary{}) {
		t.Errorf("summarize(nil) = %+v; want zero", got)
	}
}

func TestCDFPoints(t *testing.T) {
	t.Parallel()
	sorted := make([]time.Duration, 1000)
	for i := range sorted {
		sorted[i] = time.Duration(i + 1)
	}
	pts := cdfPoints(sorted, 50)
	if len(pts) != 50 {
		t.Fatalf("len(cdfPoints(1000 samples, 50)) = %d; want 50", len(pts))
	}
	if first, last := pts[0], pts[len(pts)-1]; first.D != 1 || last.D != 1000 || last.Share != 1 {
		t.Errorf("cdfPoints ends = %+v, %+v; want min 1 and max 1000 at share 1", first, last)
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].D < pts[i-1].D || pts[i].Share <= pts[i-1].Share {
			t.Fatalf("cdfPoints not increasing at %d: %+v then %+v", i, pts[i-1], pts[i])
		}
	}
	if got := cdfPoints(ms(1, 2), 50); len(got) != 2 || got[1].Share != 1 {
		t.Errorf("cdfPoints(2 samples) = %+v; want both samples, the last at share 1", got)
	}
}
