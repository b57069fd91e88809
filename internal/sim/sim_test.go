package sim

import (
	"flag"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	seeds = flag.Int("sim.seeds", defaultSeeds(), "how many seeds TestSim runs (1..N); 500 by default, 60 under -race")
	seed  = flag.Uint64("sim.seed", 0, "replay this one seed (with the Client hooks traced) and print its history")
	first = flag.Uint64("sim.first", 1, "the first seed TestSim runs")
)

func defaultSeeds() int {
	if RaceEnabled {
		return 60
	}
	return 500
}

// runSeed runs one plan in a bubble of its own.
func runSeed(t *testing.T, p Plan) Result {
	t.Helper()
	var res Result
	synctest.Test(t, func(t *testing.T) { res = Run(p) })
	return res
}

// TestSim runs seeds first..first+seeds-1 (two at a time per core) and
// fails with each failing seed's plan and compact history. -sim.seed=S
// replays one seed with tracing.
func TestSim(t *testing.T) {
	if *seed != 0 {
		p := NewPlan(*seed)
		p.Trace = true
		res := runSeed(t, p)
		t.Logf("%v: %d holds, %d violations", p, res.Holds, len(res.Violations))
		if res.Failed() {
			t.Errorf("seed %d failed (replay: go test ./internal/sim -run 'TestSim$' -sim.seed=%d):\n%s", p.Seed, p.Seed, res.Report)
		}
		return
	}
	start := time.Now()
	var holds, failed atomic.Int64
	t.Run("seeds", func(t *testing.T) {
		for s := *first; s < *first+uint64(*seeds); s++ {
			t.Run(fmt.Sprint(s), func(t *testing.T) {
				t.Parallel()
				res := runSeed(t, NewPlan(s))
				holds.Add(int64(res.Holds))
				if res.Failed() {
					failed.Add(1)
					t.Errorf("seed %d failed (replay: go test ./internal/sim -run 'TestSim$' -sim.seed=%d):\n%s", s, s, compact(res))
				}
			})
		}
	})
	t.Logf("%d seeds from %d, %d holds, %d failed, in %v", *seeds, *first, holds.Load(), failed.Load(), time.Since(start).Round(time.Millisecond))
}

// searchSeeds runs plans from seeds first.. (GOMAXPROCS at once, in
// batches) until catch reports true for one, at most n seeds, and returns
// that seed and its result (0 if none caught).
func searchSeeds(t *testing.T, first uint64, n int, plan func(uint64) Plan, catch func(Result) bool) (uint64, Result) {
	t.Helper()
	batch := uint64(runtime.GOMAXPROCS(0))
	for s := first; s < first+uint64(n); s += batch {
		var mu sync.Mutex
		var got uint64
		var res Result
		t.Run(fmt.Sprint("from-", s), func(t *testing.T) {
			for k := s; k < s+batch && k < first+uint64(n); k++ {
				t.Run(fmt.Sprint(k), func(t *testing.T) {
					t.Parallel()
					r := runSeed(t, plan(k))
					if catch(r) {
						mu.Lock()
						if got == 0 || k < got {
							got, res = k, r
						}
						mu.Unlock()
					}
				})
			}
		})
		if got != 0 {
			return got, res
		}
	}
	return 0, Result{}
}

// compact is a failure's report: the plan, the violations, and the events
// from a second before the first violation to shortly after it.
func compact(res Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v\n", res.Plan)
	for _, v := range res.Violations {
		fmt.Fprintf(&b, "VIOLATION %v\n", v)
	}
	at := res.Violations[0].At
	for _, line := range strings.Split(res.Report, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(line, "VIOLATION") {
			continue
		}
		d, err := time.ParseDuration(f[0])
		if err != nil || (d >= at-time.Second && d <= at+200*time.Millisecond) || strings.Contains(line, "fault") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
