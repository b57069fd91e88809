package sim

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// span is one hold of a read-write lock or of a semaphore's permit, in
// fake time: [the call returned, min(Unlock called, Lost closed,
// ValidUntil)].
type span struct {
	client   int
	resource string
	write    bool
	start    time.Time
	end      time.Time
	called   time.Time // the call that returned it began (zero: not recorded)
}

// spans is a profile's record of its holds.
type spans struct {
	mu sync.Mutex // protects xs
	xs []*span
}

func (s *spans) add(x *span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.xs = append(s.xs, x)
}

func (s *spans) all() []*span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.xs)
}

// violateAt records a violation that happened at t (a check after the
// run finds it).
func (h *History) violateAt(t time.Time, inv, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.viol = append(h.viol, Violation{Invariant: inv, At: h.since(t), Detail: fmt.Sprintf(format, args...)})
}

// settle idles a worker from the end of the fault phase to the quiet
// phase (as LockProfile's workers do); false at the run's end.
func settle(env *Env) bool {
	if since := time.Since(env.start); since >= env.Plan.FaultPhase && since < env.Plan.Healed() {
		return env.SleepUntil(env.At(env.Plan.Healed()))
	}
	return true
}

// holdSpan holds l for up to 300 ms and returns when its hold ends:
// then, at a loss (Lost closed, Valid false) or at the run's end.
func holdSpan(env *Env, r *rand.Rand, l *redlock.Lock, atLeast time.Duration) time.Time {
	until := time.Now().Add(max(time.Duration(r.IntN(30))*grid, atLeast))
	tm := time.NewTimer(time.Until(until))
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-l.Lost():
	case <-env.ctx.Done():
	}
	return minTime(time.Now(), l.ValidUntil())
}

// hold records l, which client c's call kind returned for resource res,
// as a hold of s (checking that it is valid), holds it (holdSpan) and
// unlocks it; ctx is the call's.
func (s *spans) hold(ctx context.Context, env *Env, r *rand.Rand, l *redlock.Lock, c int, kind, res string, write bool, called time.Time, atLeast time.Duration) {
	h := env.History
	x := &span{client: c, resource: res, write: write, start: time.Now(), called: called}
	h.Note("c%d %s %s: hold from %v", c, kind, res, h.since(x.start))
	if !l.Valid() {
		h.Violate("invalid-lock", "c%d %s %s returned a lock with Valid() false", c, kind, res)
	}
	h.own(l.Token(), c, kind)
	x.end = holdSpan(env, r, l, atLeast)
	s.add(x)
	_ = l.Unlock(context.WithoutCancel(ctx))
	h.giveUp(l.Token(), time.Now())
}

// RWLockProfile is the workload of redlock's RLock and WLock: every worker
// goroutine of every regular Client loops over the plan's resources (1 or
// 2), taking a read lock three times in four and the write lock otherwise
// (the blocking call, or its Try form one time in four), holds it for up
// to 300 ms and unlocks it.
//
// Its invariant (rw-overlap): a writer's hold never intersects another
// hold of its resource, a reader's or a writer's; readers may overlap.
// Its holds are its own, not History's (whose overlap check would count
// readers sharing).
type RWLockProfile struct {
	holds spans
	waits spans // the blocking RLock and WLock calls: [called, returned or its ctx's deadline]
	mu    sync.Mutex
	skip  map[string][][2]time.Time // a frozen writer that turned holder (frozenWriter)
}

// Name is "rwlock".
func (p *RWLockProfile) Name() string { return "rwlock" }

// Start launches the workers, and the frozen writer (the plan's
// FrozenWaiter).
func (p *RWLockProfile) Start(env *Env) {
	p.skip = make(map[string][][2]time.Time)
	for c := range env.Plan.Clients {
		for w := range env.Plan.Workers {
			r := env.Rand(fmt.Sprintf("rw worker %d/%d", c, w))
			r2 := env.Rand(fmt.Sprintf("rw worker42 %d/%d", c, w))
			env.Go(func() { p.worker(env, c, r, r2) })
		}
	}
	if env.Plan.FrozenWaiter {
		env.Go(func() { p.frozenWriter(env, env.Plan.Clients) })
	}
}

// frozenWriter is the read-write lock's frozen waiter (issue 33: the
// waiters' bookkeeping): client c waits in WLock on resource 0 from early
// in the quiet phase; once it is queued and none of its requests is in
// flight, its pipes freeze for the plan's FrozenFor, without a word to
// the nodes (a process that stopped). Its entry lapses by itself (prune)
// a queue entry's life after its last attempt, and until then it keeps
// out the callers after it; rw-liveness bounds that. It is not counted
// as waiting; a grant that came in just before the freeze makes it a
// frozen holder, and the bound skips the resource until its lease ran
// out.
func (p *RWLockProfile) frozenWriter(env *Env, c int) {
	pl := env.Plan
	h := env.History
	res := resourceName(0)
	if !env.SleepUntil(env.At(pl.Healed() + frozenWaiterAfter)) {
		return
	}
	ctx, cancel := context.WithCancel(env.ctx)
	defer cancel()
	done := make(chan struct{})
	var got atomic.Bool
	env.Go(func() {
		defer close(done)
		r := env.Rand("rw frozen writer")
		l, err := env.Clients[c].WLock(ctx, res)
		if err != nil {
			return
		}
		got.Store(true)
		p.holds.hold(ctx, env, r, l, c, "WLock (frozen writer)", res, true, time.Time{}, 0)
	})
	var from time.Time // the freeze
	defer func() {
		cancel()
		<-done
		if got.Load() && !from.IsZero() {
			// Its grant came in before the freeze (it returned only
			// after it): a frozen holder.
			p.mu.Lock()
			p.skip[res] = append(p.skip[res], [2]time.Time{from, from.Add(pl.FrozenFor + pl.TTL)})
			p.mu.Unlock()
		}
	}()
	ok := env.SleepUntil(time.Now().Add(2 * pl.RetryMax))
	for ok && !env.cl.net.idle(c, 10*time.Millisecond) {
		ok = env.SleepUntil(time.Now().Add(time.Millisecond))
	}
	select {
	case <-done:
		ok = false
	default:
	}
	if !ok || got.Load() {
		return
	}
	from = time.Now()
	env.cl.net.freezeClient(c, true)
	env.faults.add(Fault{Kind: ClientFreeze, Client: c}, from, from.Add(pl.FrozenFor))
	h.Note("c%d (frozen writer) frozen while waiting for %s", c, res)
	env.SleepUntil(from.Add(pl.FrozenFor))
	env.cl.net.freezeClient(c, false)
	h.Note("c%d (frozen writer) thawed", c)
}

func (p *RWLockProfile) worker(env *Env, c int, r, r2 *rand.Rand) {
	rc := env.Clients[c]
	for nextGrid(env, r, 50) && settle(env) {
		res := resourceName(r.IntN(env.Plan.Resources))
		write := r.IntN(4) == 0
		try := r.IntN(4) == 0
		ctx, cancel := context.WithTimeout(env.ctx, env.Plan.TTL/2+time.Duration(r.Int64N(int64(2*env.Plan.TTL))))
		var l *redlock.Lock
		var err error
		w := &span{client: c, resource: res, write: write, start: time.Now()}
		switch {
		case write && try:
			l, err = rc.TryWLock(ctx, res)
		case write:
			l, err = rc.WLock(ctx, res)
		case try:
			l, err = rc.TryRLock(ctx, res)
		default:
			l, err = rc.RLock(ctx, res)
		}
		if !try {
			w.end = minTime(time.Now(), deadline(ctx))
			p.waits.add(w)
		}
		if err != nil {
			cancel()
			continue
		}
		kind := "RLock"
		if write {
			kind = "WLock"
		}
		p.holds.hold(ctx, env, r, l, c, kind, res, write, w.start, quietHold(env, r2))
		cancel()
	}
}

// Check checks that no writer's hold intersects another hold of its
// resource.
func (p *RWLockProfile) Check(env *Env) {
	h := env.History
	xs := p.holds.all()
	slices.SortFunc(xs, func(a, b *span) int { return a.start.Compare(b.start) })
	for i, a := range xs {
		for _, b := range xs[i+1:] {
			if !b.start.Before(a.end) {
				break
			}
			if a.resource != b.resource || !a.write && !b.write {
				continue
			}
			h.violateAt(b.start, "rw-overlap", "%s: c%d (write %v, %v..%v) and c%d (write %v, %v..%v) held together",
				a.resource, a.client, a.write, h.since(a.start), h.since(a.end), b.client, b.write, h.since(b.start), h.since(b.end))
			return
		}
	}
	p.checkLiveness(env)
	p.checkFairness(env)
}

// checkFairness is rw-fairness (issue 33, the rule of rw.lua: a reader
// is granted only with no live waiting writer before it in the order):
// from the quiet phase on, for the writers of Clients with the queue, with no node or link fault since before the
// writer called, no reader whose call began after a blocking WLock's
// began is granted while that WLock waits, once it has had writerQueued
// to queue (its first attempt is refused without queueing; it queues with
// the next, at once). Calls that begin at one instant share a ticket and
// the members order them, so only a reader that called strictly later
// counts.
func (p *RWLockProfile) checkFairness(env *Env) {
	h := env.History
	from := env.At(env.Plan.Healed())
	if env.faults.lastEnd().After(from) {
		return
	}
	holds, waits := p.holds.all(), p.waits.all()
	// busy: another call of w's Client on its resource was under way when
	// w began; w then waits behind it in its Client first (redlock's
	// Lock calls of one Client queue locally), and takes its place on the
	// nodes only after it.
	busy := func(w *span) bool {
		for _, x := range waits {
			if x != w && x.client == w.client && x.resource == w.resource && !x.start.After(w.start) && x.end.After(w.start) {
				return true
			}
		}
		for _, x := range holds {
			if x.client == w.client && x.resource == w.resource && !x.start.After(w.start) && x.end.After(w.start) {
				return true
			}
		}
		return false
	}
	for _, w := range waits {
		if !w.write || w.start.Before(from) || !env.Plan.Queue[w.client] || busy(w) {
			continue // a writer of a Client without the queue never queues
		}
		for _, x := range holds {
			if x.write || x.resource != w.resource || x.called.IsZero() || !x.called.After(w.start) {
				continue
			}
			if x.start.After(w.start.Add(writerQueued)) && x.start.Before(w.end) {
				h.violateAt(x.start, "rw-fairness", "%s: c%d's reader, called at %v, granted at %v while c%d's writer, called at %v, waited (until %v)",
					x.resource, x.client, h.since(x.called), h.since(x.start), w.client, h.since(w.start), h.since(w.end))
				return
			}
		}
	}
}

// writerQueued is how long after a WLock call began its entry is on the
// nodes, with no fault: two rounds and the subscription's confirmation,
// a few milliseconds, and a margin.
const writerQueued = 20 * time.Millisecond

// checkLiveness is rw-liveness (issue 33, for the read-write lock's own
// bookkeeping): from the quiet phase on, a resource on which a blocking
// RLock or WLock waits (its ctx live) is never without a holder of
// either kind for longer than the lock's liveness bound
// (Plan.WaitBound). A waiter entry that lapsed but is never pruned, or a
// marker left without a live reader, keeps every later caller out
// although nobody holds.
func (p *RWLockProfile) checkLiveness(env *Env) {
	h := env.History
	var waits []*Wait
	var holds []*Hold
	for _, w := range p.waits.all() {
		waits = append(waits, &Wait{Client: w.client, Resource: w.resource, Start: w.start, End: w.end})
	}
	for _, x := range p.holds.all() {
		holds = append(holds, &Hold{Client: x.client, Resource: x.resource, Start: x.start, End: x.end})
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p.mu.Lock()
	skip := p.skip
	p.mu.Unlock()
	h.livenessLocked("rw-liveness", waits, holds, env.At(env.Plan.Healed()), env.At(env.Plan.Duration()), env.Plan.WaitBound(), skip)
}

// semPermits is K of the semaphore profile: 2, or the plan's SemK.
func semPermits(p Plan) int { return max(2, p.SemK) }

// SemaphoreProfile is the workload of redlock's Semaphore (K = 2): two
// goroutines on every regular Client loop over Acquire (or TryAcquire one
// time in four) of one semaphore, hold the permit for up to 300 ms and
// Unlock it.
//
// Its invariants: at no instant do more than K holds intersect
// (sem-overflow); K holds intersect at some instant (sem-capacity); and,
// once faults stopped, an Acquire never waits longer than the liveness
// bound while fewer than K hold (sem-liveness).
type SemaphoreProfile struct {
	holds spans
	waits spans // the blocking Acquire calls: [called, returned or its ctx's deadline]
}

// Name is "semaphore".
func (p *SemaphoreProfile) Name() string { return "semaphore" }

// Start launches the workers.
func (p *SemaphoreProfile) Start(env *Env) {
	for c := range env.Plan.Clients {
		s, err := env.Clients[c].Semaphore("sem", semPermits(env.Plan))
		if err != nil {
			panic(fmt.Sprintf("sim: Semaphore: %v", err)) // a valid name and K
		}
		// More callers than K: two per Client for K = 2, three for K = 3.
		for w := range semPermits(env.Plan) {
			r := env.Rand(fmt.Sprintf("sem worker %d/%d", c, w))
			r2 := env.Rand(fmt.Sprintf("sem worker42 %d/%d", c, w))
			env.Go(func() { p.worker(env, c, s, r, r2) })
		}
	}
}

func (p *SemaphoreProfile) worker(env *Env, c int, s *redlock.Semaphore, r, r2 *rand.Rand) {
	for nextGrid(env, r, 50) && settle(env) {
		ctx, cancel := context.WithTimeout(env.ctx, env.Plan.TTL/2+time.Duration(r.Int64N(int64(2*env.Plan.TTL))))
		var l *redlock.Lock
		var err error
		if r.IntN(4) == 0 {
			l, err = s.TryAcquire(ctx)
		} else {
			w := &span{client: c, start: time.Now()}
			l, err = s.Acquire(ctx)
			w.end = minTime(time.Now(), deadline(ctx))
			p.waits.add(w)
		}
		if err != nil {
			cancel()
			continue
		}
		p.holds.hold(ctx, env, r, l, c, "Acquire", l.Resource(), false, time.Time{}, quietHold(env, r2))
		cancel()
	}
}

// Check checks that no instant has more than K holders: a sweep over the
// holds' starts and ends (an end at a start's instant comes first).
func (p *SemaphoreProfile) Check(env *Env) {
	h := env.History
	type edge struct {
		at time.Time
		d  int
		x  *span
	}
	var es []edge
	for _, x := range p.holds.all() {
		if x.end.After(x.start) {
			es = append(es, edge{x.start, 1, x}, edge{x.end, -1, x})
		}
	}
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d
	})
	n, most := 0, 0
	for _, e := range es {
		n += e.d
		most = max(most, n)
		if k := semPermits(env.Plan); n > k {
			h.violateAt(e.at, "sem-overflow", "%d holders of a K=%d semaphore at %v (c%d took %s)", n, k, h.since(e.at), e.x.client, e.x.resource)
			return
		}
	}
	// sem-capacity (issue 33): K holders at once, at least once. Four to
	// six workers that each want a permit about a third of the time
	// (holds up to 300 ms, rests up to 500 ms) fill both permits at some
	// instant of every run; a semaphore whose permits share fewer slots
	// never does.
	if k := semPermits(env.Plan); most < k {
		h.Violate("sem-capacity", "never %d holders of a K=%d semaphore at once (at most %d, %d holds)", k, k, most, len(es)/2)
	}
	p.checkLiveness(env)
}

// quiet is the semaphore's quiet phase: long enough for sem-liveness to
// see a gap of its bound (twice Plan.WaitBound, 2.1 s at the plan's
// options) that starts up to 1.5 s into it. The plan's 2 s quiet phase was
// shorter than the bound, so the check could never fire.
func (p *SemaphoreProfile) quiet(pl Plan) time.Duration {
	return 2*pl.WaitBound() + 1500*time.Millisecond
}

// checkLiveness is sem-liveness (issue 33): from the quiet phase on, a
// blocking Acquire never waits longer than twice the plan's liveness
// bound (Plan.WaitBound, the lock's) while fewer than K permits are held.
// Twice: a contended Acquire waits in two queues, the turnstile lock's
// and then every permit's (redlock/semaphore.go), each a handoff that
// the lock's bound covers once; at the lock's bound, 1 of 150 semaphore
// seeds failed once in six replays (seed 114, a waiter from the quiet
// phase's first instant).
func (p *SemaphoreProfile) checkLiveness(env *Env) {
	h := env.History
	from, to, bound := env.At(env.Plan.Healed()), env.At(env.Plan.Duration()), semBound(env.Plan)
	holds, waits := p.holds.all(), p.waits.all()
	k := semPermits(env.Plan)
	in := func(x *span, t time.Time) bool { return !x.start.After(t) && x.end.After(t) }
	var gap time.Time
	var who *span
	for t := from; t.Before(to); t = t.Add(time.Millisecond) {
		var w *span
		for _, x := range waits {
			if in(x, t) {
				w = x
				break
			}
		}
		n := 0
		for _, x := range holds {
			if in(x, t) {
				n++
			}
		}
		h.mu.Lock()
		if h.excusedAt(t) {
			n = k
		}
		h.mu.Unlock()
		switch {
		case w != nil && n < k && gap.IsZero():
			gap, who = t, w
		case (w == nil || n >= k) && !gap.IsZero():
			gap = time.Time{}
		}
		if !gap.IsZero() && t.Sub(gap) > bound {
			h.violateAt(gap, "sem-liveness", "fewer than %d holders of the K=%d semaphore and a waiter for more than %v from %v (c%d waiting since %v)",
				k, k, bound, h.since(gap), who.client, h.since(who.start))
			return
		}
	}
}

// rwFlag puts the read-write lock's profile in the seed loop (on by
// default; -sim.rwlock=false leaves it out).
var rwFlag = flag.Bool("sim.rwlock", true, "run the rwlock profile in one seed of five (s%5 == 2) of TestSim")

// rwSeeds is -sim.rwlock for the controls test: its rwlock control sets it.
var rwSeeds atomic.Bool

// semFlag and semSeeds are the same for the semaphore profile.
var semFlag = flag.Bool("sim.semaphore", true, "run the semaphore profile in one seed of ten (s%10 == 4) of TestSim")

var semSeeds atomic.Bool

// onlyFlag runs one profile in every seed of TestSim, for a soak of one
// profile.
var onlyFlag = flag.String("sim.only", "", "run only this profile (lock, rwlock, semaphore, election) in every seed of TestSim")

// profileNamed returns a new profile of that name, nil if none.
func profileNamed(name string) Profile {
	switch name {
	case "lock":
		return &LockProfile{}
	case "rwlock":
		return &RWLockProfile{}
	case "semaphore":
		return &SemaphoreProfile{}
	case "election":
		return &ElectionProfile{}
	}
	return nil
}

// profilesFor is the workload of seed s: the lock profile, but the
// semaphore's in one seed of ten (s%10 == 4: such a seed costs twice a
// lock seed), the election's in one of ten (s%10 == 8) and the read-write
// lock's in one of five (s%5 == 2), so that 500 seeds cost about what they
// did without them; with -sim.only, that one profile in every seed.
func profilesFor(s uint64) []Profile {
	if pr := profileNamed(*onlyFlag); pr != nil {
		return []Profile{pr}
	}
	switch {
	case s%5 == 2 && (*rwFlag || rwSeeds.Load()):
		return []Profile{&RWLockProfile{}}
	case s%10 == 4 && (*semFlag || semSeeds.Load()):
		return []Profile{&SemaphoreProfile{}}
	case s%10 == 8 && (*electionFlag || electionSeeds.Load()):
		return []Profile{&ElectionProfile{}}
	}
	return []Profile{&LockProfile{}}
}

// semBound is sem-liveness's bound: one and a half times the lock's
// (Plan.WaitBound), 1.58 s at the plan's options (issue 42: twice, 2.1 s,
// let a head waiter's slip of a whole second pass). A contended Acquire
// waits behind the turnstile lock's handoff and then a permit's; the
// second starts only once the first waiter in line gave up, which the
// half covers.
func semBound(p Plan) time.Duration { return 3 * p.WaitBound() / 2 }

// quietHold is how long at least a hold of the quiet phase lasts (issue
// 42's LongQuietHolds): one in three lasts 0.6-1.4 s, past a handoff's
// reservation and past the first renewal (a reader's mark, a permit's
// key), else 0.
func quietHold(env *Env, r2 *rand.Rand) time.Duration {
	k := r2.IntN(3)
	d := 600*time.Millisecond + time.Duration(r2.Int64N(int64(800*time.Millisecond)))
	if k != 0 || !env.Plan.LongQuietHolds || time.Since(env.start) < env.Plan.Healed() {
		return 0
	}
	return d
}
