package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	seeds    = flag.Int("sim.seeds", defaultSeeds(), "how many seeds TestSim runs (1..N); 500 by default, 60 under -race")
	seed     = flag.Uint64("sim.seed", 0, "replay this one seed (with the Client hooks traced) and print its history")
	first    = flag.Uint64("sim.first", 1, "the first seed TestSim runs")
	replays  = flag.Int("sim.replays", 1, "with -sim.seed: run the seed this many times and report how many failed")
	shrinkF  = flag.Bool("sim.shrink", false, "with -sim.seed: shrink a failing seed's plan (fewer faults, clients, workers, resources, nodes) while it still fails")
	ctlName  = flag.String("sim.control", "", "apply this negative control (see controls) to TestSim's seeds")
	xrace    = flag.Float64("sim.extend-race", -1, "the share of holds that end with an Extend racing the Unlock (default: the plan's, 0.2)")
	lagRange = flag.String("sim.quiet-lag", "", "the quiet lag's range each way, lo:hi node timeouts (default: the plan's, QuietLagLo:QuietLagHi)")
	stopF    = flag.Bool("sim.failfast", false, "stop after the first batch of seeds in which one failed (the mutation driver's runs: internal/sim/mutate)")
)

// plan is seed's plan with the flags' changes.
func plan(seed uint64) Plan {
	p := NewPlan(seed)
	if *xrace >= 0 {
		p.ExtendRace = *xrace
	}
	if q := p.QuietLag; q != nil && *lagRange != "" {
		var lo, hi float64
		if _, err := fmt.Sscanf(*lagRange, "%g:%g", &lo, &hi); err != nil {
			panic(fmt.Sprintf("-sim.quiet-lag=%q: want lo:hi (node timeouts each way): %v", *lagRange, err))
		}
		l := *q
		l.Delay = l.scaled(p.NodeTimeout, lo, hi)
		p.QuietLag = &l
	}
	return p
}

func defaultSeeds() int {
	if RaceEnabled {
		return 60
	}
	return 500
}

// runSeed runs one plan in a bubble of its own, with its seed's profile
// (profilesFor). A seed that has not ended after -sim.hang of wall time
// hung: a loop that never blocks stops the bubble's clock (fake time
// moves only when every goroutine waits), so the run can never end. It
// is reported as the seed's violation (hang) in the format the mutation
// driver reads, and the process exits: a bubble cannot be stopped from
// outside.
func runSeed(t *testing.T, p Plan) Result {
	t.Helper()
	var res Result
	wd := time.AfterFunc(*hangAfter, func() {
		fmt.Printf("seed %d failed (replay: %s):\nVIOLATION hang at wall-%v: the seed did not end within %v of wall time (a seed takes a second or less)\n",
			p.Seed, replayCommand(p.Seed), *hangAfter, *hangAfter)
		// Every goroutine's stack, to stderr after the report: a hang
		// replayed alone has not come back so far (seed 316 beside the
		// race suite), so the stacks of the run that hung are what there is.
		buf := make([]byte, 64<<20)
		os.Stderr.Write(buf[:runtime.Stack(buf, true)])
		os.Exit(1)
	})
	defer wd.Stop()
	synctest.Test(t, func(t *testing.T) { res = Run(p, profilesFor(p.Seed)...) })
	return res
}

// hangAfter is -sim.hang: a seed takes 0.1-0.5 s of CPU (ten times that
// under -race), a few seconds of wall time on a loaded 2-core machine.
var hangAfter = flag.Duration("sim.hang", defaultHang(), "a seed that runs longer than this (wall time) hung: the run reports it and exits")

func defaultHang() time.Duration {
	if RaceEnabled {
		return 15 * time.Minute
	}
	return 3 * time.Minute
}

// TestSim runs seeds first..first+seeds-1 (two at a time per core) and
// fails with each failing seed's plan and compact history. -sim.seed=S
// replays one seed with tracing.
func TestSim(t *testing.T) {
	if *ctlName != "" {
		c, ok := controlNamed(*ctlName)
		if !ok {
			t.Fatalf("-sim.control=%q: no such control", *ctlName)
		}
		c.set(t)
	}
	if *seed != 0 {
		p := plan(*seed)
		p.Trace = *replays == 1
		failures := 0
		var res, failure Result
		for range *replays {
			res = runSeed(t, p)
			if res.Failed() {
				failures++
				failure = res
			}
		}
		t.Logf("%v: %d holds, %d terms; failed %d of %d runs", p, res.Holds, res.Terms, failures, *replays)
		if failures == 0 {
			return
		}
		if *shrinkF {
			small := shrink(t, failure)
			t.Logf("shrunk to %v", small.Plan)
			failure = small
		}
		t.Errorf("seed %d failed (replay: %s):\n%s", p.Seed, replayCommand(p.Seed), failure.Report)
		return
	}
	start := time.Now()
	if *onlyFlag != "" && profileNamed(*onlyFlag) == nil {
		t.Fatalf("-sim.only=%q: no such profile (lock, rwlock, semaphore, election)", *onlyFlag)
	}
	var holds, terms, failed atomic.Int64
	// In batches of parallel subtests: a run of 100,000 seeds keeps a
	// batch's goroutines, not 100,000 parked subtests. A long run prints its
	// progress every 6,400 seeds. With -sim.failfast, batches of 16: the
	// mutation driver wants the first catch soon.
	batch := uint64(64)
	if *stopF {
		batch = 16
	}
	end := *first + uint64(*seeds)
	for b := *first; b < end; b += batch {
		t.Run(fmt.Sprint("from-", b), func(t *testing.T) {
			for s := b; s < min(b+batch, end); s++ {
				t.Run(fmt.Sprint(s), func(t *testing.T) {
					t.Parallel()
					res := runSeed(t, plan(s))
					holds.Add(int64(res.Holds))
					terms.Add(int64(res.Terms))
					if res.Failed() {
						failed.Add(1)
						t.Errorf("seed %d failed (replay: %s):\n%s", s, replayCommand(s), compact(res))
					}
				})
			}
		})
		if *stopF && failed.Load() > 0 {
			break
		}
		if done := b + batch - *first; *seeds >= 10000 && done%(100*batch) == 0 {
			fmt.Printf("sim: %d seeds done, %d failed, %v\n", done, failed.Load(), time.Since(start).Round(time.Second))
		}
	}
	t.Logf("%d seeds from %d, %d holds, %d terms, %d failed, in %v", *seeds, *first, holds.Load(), terms.Load(), failed.Load(), time.Since(start).Round(time.Millisecond))
}

// replayCommand is the command that replays seed s as this run ran it:
// with its -sim.only, -sim.control, -sim.extend-race, profile switches
// and -race, which choose the seed's plan and profile, the library's
// behaviour and the scheduling.
func replayCommand(s uint64) string {
	cmd := fmt.Sprintf("go test ./internal/sim -run 'TestSim$' -sim.seed=%d", s)
	if *onlyFlag != "" {
		cmd += " -sim.only=" + *onlyFlag
	}
	for _, f := range []struct {
		name string
		on   bool
	}{{"rwlock", *rwFlag}, {"semaphore", *semFlag}, {"election", *electionFlag}} {
		if !f.on {
			cmd += " -sim." + f.name + "=false"
		}
	}
	if *ctlName != "" {
		cmd += " -sim.control=" + *ctlName
	}
	if *xrace >= 0 {
		cmd += fmt.Sprintf(" -sim.extend-race=%v", *xrace)
	}
	if RaceEnabled {
		cmd += " -race"
	}
	return cmd
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

// shrink retries a failing run's plan with less in it — each fault
// removed, the frozen waiter, a Client, a worker, a resource, five nodes
// down to three — and keeps each change after which the plan still fails
// with the same invariant (in one of two runs: scheduling is not fully
// deterministic), until no change keeps it failing.
func shrink(t *testing.T, res Result) Result {
	t.Helper()
	want := res.Violations[0].Invariant
	fails := func(p Plan) (Result, bool) {
		for range 2 {
			r := runSeed(t, p)
			if slices.ContainsFunc(r.Violations, func(v Violation) bool { return v.Invariant == want }) {
				return r, true
			}
		}
		return Result{}, false
	}
	for {
		p := res.Plan
		var cands []Plan
		for i := range p.Faults {
			c := p
			c.Faults = slices.Delete(slices.Clone(p.Faults), i, i+1)
			cands = append(cands, c)
		}
		if p.FrozenWaiter {
			c := p
			c.FrozenWaiter = false
			cands = append(cands, c)
		}
		if p.LongHold != nil {
			c := p
			c.LongHold = nil
			cands = append(cands, c)
		}
		if p.Clients > 1 {
			c := p
			c.Clients--
			c.Queue = p.Queue[:c.Clients]
			c.Faults = slices.DeleteFunc(slices.Clone(p.Faults), func(f Fault) bool { return f.Client >= c.Clients })
			if c.LongHold != nil && c.LongHold.Client >= c.Clients {
				c.LongHold = nil
			}
			if hs := c.Handoff; hs != nil && (hs.Holder >= c.Clients || hs.Waiter >= c.Clients) {
				c.Handoff = nil
			}
			cands = append(cands, c)
		}
		if p.Workers > 1 {
			c := p
			c.Workers--
			cands = append(cands, c)
		}
		if p.Resources > 1 {
			c := p
			c.Resources--
			cands = append(cands, c)
		}
		if p.Nodes > 3 {
			c := p
			c.Nodes = 3
			c.Faults = slices.DeleteFunc(slices.Clone(p.Faults), func(f Fault) bool { return f.Node >= 3 })
			c.Drift, c.Offset = p.Drift[:3], p.Offset[:3]
			c.LongHold = nil
			c.Handoff = nil
			c.YieldKeep = false
			if g := c.GuardEpisode; g != nil && (g.Node[0] >= 3 || g.Node[1] >= 3) {
				c.GuardEpisode = nil
			}
			cands = append(cands, c)
		}
		if p.GuardEpisode != nil {
			c := p
			c.GuardEpisode = nil
			cands = append(cands, c)
		}
		shrunk := false
		for _, c := range cands {
			if r, ok := fails(c); ok {
				res, shrunk = r, true
				break
			}
		}
		if !shrunk {
			return res
		}
	}
}
