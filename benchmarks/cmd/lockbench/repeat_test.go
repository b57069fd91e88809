package main

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestMedianAndSpread(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		in           []float64
		med, spreadX float64
	}{
		{"none", nil, 0, 0},
		{"one", []float64{4}, 4, 0},
		{"even", []float64{4, 2}, 3, 2.0 / 3},
		{"odd", []float64{10, 8, 12}, 10, 0.4},
		{"zero median", []float64{0, 0, 5}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := medianFloat(tc.in); got != tc.med {
				t.Errorf("medianFloat(%v) = %v; want %v", tc.in, got, tc.med)
			}
			if got := spread(tc.in); math.Abs(got-tc.spreadX) > 1e-9 {
				t.Errorf("spread(%v) = %v; want %v", tc.in, got, tc.spreadX)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	t.Parallel()
	run := func(rate float64, fair *Fairness, ds ...time.Duration) *Result {
		r := &Result{Scenario: "contended", Lib: "quorumlock", Nodes: 5, Run: Run{Ops: len(ds), Elapsed: time.Second, OpsPerSec: rate, Fair: fair}}
		for _, d := range ds {
			r.Samples = append(r.Samples, sample{D: d})
		}
		r.Summary = summarize(ds)
		return r
	}
	m := merge([]*Result{
		run(100, &Fairness{LongestWait: 9 * time.Millisecond, Handoffs: 2, ToOther: 2, PerInstance: []int{1, 2}}, ms(1, 2, 3)...),
		run(300, &Fairness{LongestWait: 40 * time.Millisecond, Handoffs: 3, ToOther: 1, PerInstance: []int{3, 0}}, ms(5, 6, 70)...),
		run(200, &Fairness{LongestWait: 12 * time.Millisecond, Handoffs: 1, ToOther: 1}, ms(3, 4)...),
		{Scenario: "contended", Lib: "quorumlock", Nodes: 5, Run: Run{Err: "boom", Errors: 1}},
	})
	if m.Ops != 8 || m.Summary.N != 8 || len(m.Samples) != 8 || m.MinRunN != 0 || len(m.Runs) != 4 {
		t.Errorf("merge: ops %d, n %d, samples %d, fewest per run %d, runs %d; want 8, 8, 8, 0, 4",
			m.Ops, m.Summary.N, len(m.Samples), m.MinRunN, len(m.Runs))
	}
	// p50s of the three runs with samples: 2ms, 6ms, 3ms (nearest rank).
	if m.Summary.P50 != 3*time.Millisecond || m.OpsPerSec != 200 || m.Summary.Max != 70*time.Millisecond {
		t.Errorf("merge: p50 %v, ops/s %v, max %v; want the medians 3ms and 200, and the overall max 70ms", m.Summary.P50, m.OpsPerSec, m.Summary.Max)
	}
	if got, want := m.Spread.P50, (6.0-2.0)/3.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("p50 spread = %v; want %v", got, want)
	}
	if got, want := m.Spread.OpsPerSec, 1.0; got != want {
		t.Errorf("ops/s spread = %v; want %v", got, want)
	}
	if f := m.Fair; f == nil || f.Handoffs != 6 || f.ToOther != 4 || f.LongestWait != 40*time.Millisecond {
		t.Errorf("merged fairness = %+v; want 6 handoffs, 4 to another, longest 40ms", f)
	}
	if got := m.Fair.PerInstance; !slices.Equal(got, []int{4, 2}) {
		t.Errorf("merged per instance = %v; want the sums [4 2]", got)
	}
	if m.Err != "boom" || m.Errors != 1 {
		t.Errorf("merge kept error %q (%d); want the failed run's", m.Err, m.Errors)
	}
	if s := m.Samples[3]; s.Run != 1 || s.D != 5*time.Millisecond {
		t.Errorf("4th sample = %+v; want run 1's first, 5ms", s)
	}
}

// TestMerge_commandsAndLoad: per command, the median over the runs (a run
// that did not call a command counts 0 there); the load keeps its range;
// the nodes' CPU has a spread.
func TestMerge_commandsAndLoad(t *testing.T) {
	t.Parallel()
	run := func(load, cpu float64, cmds map[string]CmdCost) *Result {
		return &Result{Scenario: "clients", Lib: "quorumlock", Nodes: 5,
			Run: Run{Ops: 1, Summary: Summary{N: 1}, ServerCPUUS: cpu, Load: load, Commands: cmds}}
	}
	m := merge([]*Result{
		run(2, 100, map[string]CmdCost{"evalsha": {Calls: 10, Usec: 100}, "time": {Calls: 5, Usec: 5}}),
		run(1, 300, map[string]CmdCost{"evalsha": {Calls: 12, Usec: 140}}),
		run(3, 200, map[string]CmdCost{"evalsha": {Calls: 11, Usec: 90}, "time": {Calls: 4, Usec: 4}}),
	})
	if got, want := m.Commands["evalsha"], (CmdCost{Calls: 11, Usec: 100}); got != want {
		t.Errorf("merged evalsha = %v; want %v", got, want)
	}
	if got, want := m.Commands["time"], (CmdCost{Calls: 4, Usec: 4}); got != want {
		t.Errorf("merged time = %v; want %v (the run without it counts 0)", got, want)
	}
	if m.Load != 1 || m.LoadMax != 3 {
		t.Errorf("merged load = %v–%v; want 1–3", m.Load, m.LoadMax)
	}
	if m.ServerCPUUS != 200 || m.Spread.ServerCPU != 1 {
		t.Errorf("server CPU = %v, spread %v; want the median 200 and (300-100)/200", m.ServerCPUUS, m.Spread.ServerCPU)
	}
}
