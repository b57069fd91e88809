package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
)

// env is what a scenario runs against.
type env struct {
	fast []redis.UniversalClient // every node, directly
	// opts are the settings fast was built from (through the -node-latency
	// proxies, if any): instances of a scenario with ownNodes open clients
	// of their own with them.
	opts      []*redis.Options
	slow      []redis.UniversalClient // node 0 through the delaying proxy, the others directly
	slowBy    time.Duration           // added to each direction of node 0 in slow
	clients   int
	resources int
	hold      time.Duration
	// pace is an idle time after each operation of the slow scenario: the
	// floor, on the fast nodes, idles as long as a release through the
	// slow node takes, so that both see equally rested nodes.
	pace time.Duration
	// faults pauses and kills embedded redis-server nodes (nil with
	// miniredis or the user's own nodes: the minority scenario then fails).
	faults nodes.Faults
}

// scenario is one row group of the table. Add new ones to scenarios: a
// wake-up row needs nothing new (handoff and contended show it), a fencing
// row is a new library in libs.All.
type scenario struct {
	name  string
	about string
	// waits: the scenario needs a Lock that waits for a held lock, so the
	// floor (which never waits) takes no part.
	waits bool
	// floorOnFast: the floor runs on the fast nodes, so that ratios compare
	// with the round trip that would be possible without the fault.
	floorOnFast bool
	// concurrent: the scenario runs several goroutines at once.
	concurrent bool
	// multiNode: only libraries over several nodes take part (a slow node
	// is all a single-node library has).
	multiNode bool
	// noFloor: the floor takes no part (it sets the key on every node, so
	// a faulty node fails it).
	noFloor bool
	run     func(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error
	// runMany, when set, replaces run: it gets instances(e) lockers of
	// the library (-clients when instances is nil), each its own instance
	// (a Client of its own), over the same nodes.
	runMany   func(ctx context.Context, e *env, lks []libs.Locker, res string, r *recorder) error
	instances func(e *env) int
	// ownNodes: each instance of runMany gets go-redis node clients of its
	// own, as a process of its own would; otherwise they all share e.fast.
	ownNodes bool
	// only, when set, names the one library that takes part (a scenario of
	// an API the others lack: rwlock).
	only string
}

var scenarios = []scenario{
	{
		name:  "uncontended",
		about: "Lock+Unlock of a free resource, one goroutine",
		run:   runUncontended,
	},
	{
		name:  "extend",
		about: "Extend of a held lock (one renewal round)",
		run:   runExtend,
	},
	{
		name:        "slow",
		about:       "Lock alone, node 0 delayed by -slow per direction (floor: without the slow node)",
		floorOnFast: true,
		multiNode:   true,
		run:         runSlow,
	},
	{
		name:       "contended",
		about:      "-clients goroutines Lock+Unlock -resources resources; sample = wait in Lock",
		waits:      true,
		concurrent: true,
		run:        runContended,
	},
	{
		name:       "clients",
		about:      "-clients instances of the library, each with node clients of its own (like processes), Lock+Unlock one resource; sample = wait in Lock",
		waits:      true,
		concurrent: true,
		runMany:    runClients,
		ownNodes:   true,
	},
	{
		name:       "shared",
		about:      "-clients instances of the library over one shared set of node clients (a Client per goroutine of one process) Lock+Unlock one resource; sample = wait in Lock",
		waits:      true,
		concurrent: true,
		runMany:    runClients,
	},
	{
		name:       "mixed",
		about:      "2 instances, each with node clients of its own, × -clients/2 goroutines each Lock+Unlock one resource; sample = wait in Lock; share = acquisitions per instance",
		waits:      true,
		concurrent: true,
		runMany:    runMixed,
		instances:  func(*env) int { return 2 },
		ownNodes:   true,
	},
	{
		name:  "handoff",
		about: "holder calls Unlock → waiter blocked in Lock holds it",
		waits: true,
		run:   runHandoff,
	},
	{
		name:       "parallel",
		about:      "-clients goroutines Lock+Unlock a resource each",
		concurrent: true,
		run:        runParallel,
	},
	{
		name:       "rwlock",
		about:      "-clients goroutines, readers:writers 9:1, RLock/WLock+Unlock -resources resources; sample = wait in RLock or WLock (quorumlock only: rwlock.go)",
		waits:      true,
		concurrent: true,
		only:       "quorumlock",
		run:        runRWLock,
	},
	{
		name:      "minority",
		about:     "Lock+Unlock of a free resource (one attempt: a TryLock) with the last node paused (first half, client 0) then killed (second half, client 1)",
		multiNode: true,
		noFloor:   true,
		run:       runMinority,
	},
	semaphoreScenario, permitScenario, trylockScenario, // semaphore.go
}

func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

// selectScenarios returns the scenarios named in a comma-separated list, in
// table order; "all" or "" selects every one.
func selectScenarios(list string) ([]scenario, error) {
	if list == "" || list == "all" {
		return slices.Clone(scenarios), nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(scenarioNames(), n) {
			return nil, fmt.Errorf("unknown scenario %q (have %s)", n, strings.Join(scenarioNames(), ", "))
		}
		want[n] = true
	}
	var out []scenario
	for _, s := range scenarios {
		if want[s.name] {
			out = append(out, s)
		}
	}
	return out, nil
}

// sample is one measured operation.
type sample struct {
	Client int
	Run    int // 0-based, of -count runs
	D      time.Duration
}

// recorder collects one run's samples. It is safe for concurrent use.
type recorder struct {
	ops atomic.Int64 // read by the progress line

	mu      sync.Mutex // protects the fields below
	samples []sample
	errs    int
	lastErr error
	fair    *Fairness
}

func (r *recorder) add(client int, d time.Duration) {
	r.mu.Lock()
	r.samples = append(r.samples, sample{Client: client, D: d})
	r.mu.Unlock()
	r.ops.Add(1)
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	r.errs++
	r.lastErr = err
	r.mu.Unlock()
}

// Fairness is what the contended scenario measures besides the waits.
type Fairness struct {
	// LongestWait is the longest time a goroutine spent in one Lock call,
	// including a call still waiting when the run ended (Censored).
	LongestWait time.Duration `json:"longest_wait_ns"`
	Censored    bool          `json:"censored"`
	// Handoffs counts acquisitions that followed a release of the same
	// resource; ToOther those where the acquirer was not the releaser.
	Handoffs int `json:"handoffs"`
	ToOther  int `json:"to_other"`
	// PerInstance counts the acquisitions of each instance, in the
	// scenarios of several instances (clients, shared, mixed); nil in
	// contended.
	PerInstance []int `json:"per_instance,omitempty"`
}

// Shares returns each instance's share of the acquisitions (nil without
// PerInstance).
func (f *Fairness) Shares() []float64 {
	if f == nil || len(f.PerInstance) == 0 {
		return nil
	}
	total := 0
	for _, n := range f.PerInstance {
		total += n
	}
	out := make([]float64, len(f.PerInstance))
	for i, n := range f.PerInstance {
		if total > 0 {
			out[i] = float64(n) / float64(total)
		}
	}
	return out
}

// Share returns the share of handoffs that went to another goroutine.
func (f *Fairness) Share() float64 {
	if f == nil || f.Handoffs == 0 {
		return 0
	}
	return float64(f.ToOther) / float64(f.Handoffs)
}

// Each run gets two contexts: ctx ends at the end of the measuring time (no
// new operation starts after it), hard some seconds later (operations in
// flight are abandoned). Runners take ctx and read hard from it.
type hardKey struct{}

func hardCtx(ctx context.Context) context.Context {
	if h, ok := ctx.Value(hardKey{}).(context.Context); ok {
		return h
	}
	return ctx
}

func runUncontended(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	hard := hardCtx(ctx)
	for ctx.Err() == nil {
		start := time.Now()
		h, err := lk.Lock(hard, res)
		if err != nil {
			return err
		}
		if err := h.Unlock(hard); err != nil {
			return err
		}
		r.add(0, time.Since(start))
	}
	return nil
}

func runExtend(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	hard := hardCtx(ctx)
	h, err := lk.Lock(hard, res)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		start := time.Now()
		if err := h.Extend(hard); err != nil {
			_ = h.Unlock(context.WithoutCancel(hard))
			return err
		}
		r.add(0, time.Since(start))
	}
	return h.Unlock(context.WithoutCancel(hard))
}

func runSlow(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	hard := hardCtx(ctx)
	for ctx.Err() == nil {
		start := time.Now()
		h, err := lk.Lock(hard, res)
		if err != nil {
			return err
		}
		r.add(0, time.Since(start))
		if err := h.Unlock(hard); err != nil {
			return err
		}
		if e.pace > 0 {
			time.Sleep(e.pace)
		}
	}
	return nil
}

// runMinority measures Lock+Unlock of a free resource — one attempt, the
// TryLock path — while a minority is faulty: the last node is paused
// (SIGSTOP) for the first half of the run, then resumed and killed for the
// second half, and restarted (empty) at the end. Samples of the paused
// half are client 0, of the killed half client 1. A library that waits for
// every node (redsync) pays its node timeout on each call while the node is
// paused; quorumlock decides at a majority and leaves the paused node to
// its Client.
func runMinority(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	if e.faults == nil {
		return errors.New("the minority scenario needs embedded redis-server nodes (it pauses and kills one)")
	}
	if len(e.fast) < 3 {
		return errors.New("the minority scenario needs at least 3 nodes")
	}
	hard := hardCtx(ctx)
	last := len(e.fast) - 1
	dl, ok := ctx.Deadline()
	if !ok {
		return errors.New("the minority scenario needs a run deadline")
	}
	half := time.Now().Add(time.Until(dl) / 2)
	e.faults.Pause(last)
	phase := 0
	defer func() {
		if phase == 0 {
			e.faults.Resume(last)
		} else {
			e.faults.Restart(last)
		}
	}()
	for ctx.Err() == nil {
		if phase == 0 && time.Now().After(half) {
			e.faults.Resume(last)
			e.faults.Kill(last)
			phase = 1
		}
		start := time.Now()
		h, err := lk.Lock(hard, res)
		if err != nil {
			return err
		}
		if err := h.Unlock(hard); err != nil {
			return err
		}
		r.add(phase, time.Since(start))
	}
	return e.faults.Err()
}

// runContended runs e.clients goroutines; goroutine i uses resource
// i % e.resources. Each sample is the time one Lock call waited.
// runClients is runContended with one resource and a locker per
// goroutine: fairness across instances, as across processes (clients) or
// across Clients of one process (shared). runMixed has several goroutines
// per instance: goroutine g uses instance g % len(lks).
func runClients(ctx context.Context, e *env, lks []libs.Locker, res string, r *recorder) error {
	ce := *e
	ce.resources = 1
	return contend(ctx, &ce, func(g int) (libs.Locker, int) { return lks[g], g }, len(lks), res, r)
}

func runMixed(ctx context.Context, e *env, lks []libs.Locker, res string, r *recorder) error {
	ce := *e
	ce.resources = 1
	ce.clients = max(e.clients, len(lks))
	return contend(ctx, &ce, func(g int) (libs.Locker, int) { return lks[g%len(lks)], g % len(lks) }, len(lks), res, r)
}

func runContended(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	return contend(ctx, e, func(g int) (libs.Locker, int) { return lk, g }, 0, res, r)
}

// contend runs e.clients goroutines that Lock and Unlock e.resources
// resources, goroutine g with the locker of locker(g), and records each
// wait in Lock and who took each lock after whom: who is the second result
// of locker(g), a goroutine or an instance. With instances > 0 it also
// counts the acquisitions of each (Fairness.PerInstance).
func contend(ctx context.Context, e *env, locker func(g int) (libs.Locker, int), instances int, res string, r *recorder) error {
	hard := hardCtx(ctx)
	nres := max(1, min(e.resources, e.clients))
	type resState struct {
		mu   sync.Mutex // protects last
		last int        // goroutine or instance that took it last, -1 before the first
	}
	states := make([]*resState, nres)
	for i := range states {
		states[i] = &resState{last: -1}
	}
	var (
		mu   sync.Mutex // protects fair
		fair Fairness
		wg   sync.WaitGroup
	)
	if instances > 0 {
		fair.PerInstance = make([]int, instances)
	}
	for g := range e.clients {
		st := states[g%nres]
		name := fmt.Sprintf("%s:%d", res, g%nres)
		lk, who := locker(g)
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				h, err := lk.Lock(hard, name)
				wait := time.Since(start)
				if err != nil {
					mu.Lock()
					if wait > fair.LongestWait {
						fair.LongestWait, fair.Censored = wait, true
					}
					mu.Unlock()
					if hard.Err() == nil {
						r.fail(err)
					}
					return
				}
				st.mu.Lock()
				last := st.last
				st.last = who
				st.mu.Unlock()
				mu.Lock()
				if wait > fair.LongestWait {
					fair.LongestWait, fair.Censored = wait, false
				}
				if last >= 0 {
					fair.Handoffs++
					if last != who {
						fair.ToOther++
					}
				}
				if instances > 0 {
					fair.PerInstance[who]++
				}
				mu.Unlock()
				r.add(g, wait)
				if e.hold > 0 {
					time.Sleep(e.hold)
				}
				if err := h.Unlock(context.WithoutCancel(hard)); err != nil {
					r.fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	r.mu.Lock()
	r.fair = &fair
	r.mu.Unlock()
	return nil
}

// runHandoff measures from the holder calling Unlock to the waiter, blocked
// in Lock, holding the lock. The holder keeps the lock for e.hold (at least
// 10ms) first, so that the waiter has tried once and is waiting.
func runHandoff(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	hard := hardCtx(ctx)
	hold := max(e.hold, 10*time.Millisecond)
	for ctx.Err() == nil {
		h, err := lk.Lock(hard, res)
		if err != nil {
			return err
		}
		type got struct {
			h   libs.Held
			at  time.Time
			err error
		}
		ch := make(chan got, 1)
		go func() {
			w, err := lk.Lock(hard, res)
			ch <- got{w, time.Now(), err}
		}()
		time.Sleep(hold)
		start := time.Now()
		uerr := h.Unlock(hard)
		g := <-ch // the waiter's Lock ends at the latest with hard
		if uerr != nil {
			if g.err == nil {
				_ = g.h.Unlock(context.WithoutCancel(hard))
			}
			return uerr
		}
		if g.err != nil {
			if hard.Err() != nil {
				return nil
			}
			return g.err
		}
		r.add(1, g.at.Sub(start))
		if err := g.h.Unlock(hard); err != nil {
			return err
		}
	}
	return nil
}

func runParallel(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	hard := hardCtx(ctx)
	var (
		wg   sync.WaitGroup
		once sync.Once
		ferr error
	)
	for g := range e.clients {
		name := fmt.Sprintf("%s:%d", res, g)
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				h, err := lk.Lock(hard, name)
				if err == nil {
					err = h.Unlock(hard)
				}
				if err != nil {
					once.Do(func() { ferr = err })
					return
				}
				r.add(g, time.Since(start))
			}
		})
	}
	wg.Wait()
	if ferr != nil && hard.Err() != nil && errors.Is(ferr, hard.Err()) {
		return nil
	}
	return ferr
}
