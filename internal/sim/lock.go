package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// LockProfile is the workload of redlock's Lock: every worker goroutine of
// every regular Client loops over the plan's resources with Lock, TryLock
// or Do, holds for a while writing to a fenced register, sometimes
// Extends (sometimes racing its own Unlock), and Unlocks. With the plan's
// FrozenWaiter, one more Client waits in Lock on resource 0 early in the
// quiet phase and has its pipes frozen while it waits. A sampler reads
// every lock key on every node (directly, not through the fault layer)
// for keys of released locks.
//
// Its invariants (besides those every hold has, see History): Lock and
// TryLock never return a lock with Valid() false; a released lock's key
// does not come back (see sample); once faults stopped, the liveness
// bound (Plan.WaitBound).
type LockProfile struct {
	mu       sync.Mutex       // protects highest and slowFrom
	highest  map[string]int64 // the fenced register: per resource, the highest token applied
	slowFrom time.Time        // when the long hold's replies were slowed (zero: they are not)
	skip     map[string][][2]time.Time
}

// Name is "lock".
func (p *LockProfile) Name() string { return "lock" }

func resourceName(i int) string { return fmt.Sprintf("r%d", i) }

// grid is the step that workers align their calls to, so that calls of
// several workers start at one instant (equal tickets, ties in the queue,
// split votes) as often as they would on a busy system.
const grid = 10 * time.Millisecond

// Start launches the workers, the frozen waiter and the sampler.
func (p *LockProfile) Start(env *Env) {
	p.highest = make(map[string]int64)
	p.skip = make(map[string][][2]time.Time)
	for c := range env.Plan.Clients {
		for w := range env.Plan.Workers {
			r := env.Rand(fmt.Sprintf("worker %d/%d", c, w))
			r2 := env.Rand(fmt.Sprintf("worker42 %d/%d", c, w))
			env.Go(func() { p.worker(env, c, r, r2) })
		}
	}
	if env.Plan.FrozenWaiter {
		env.Go(func() { p.frozenWaiter(env, env.Plan.Clients) })
	}
	if lh := env.Plan.LongHold; lh != nil {
		env.Go(func() { p.longHold(env, lh) })
	}
	if env.Plan.YieldHold > 0 {
		env.Go(func() { p.holdYields(env) })
	}
	if fd := env.Plan.FenceDrop; fd != nil {
		env.Go(func() { p.fenceEpisode(env, fd) })
	}
	if hs := env.Plan.Handoff; hs != nil {
		env.Go(func() { p.handoffEpisode(env, hs) })
	}
	if env.Plan.YieldKeep {
		c := env.Plan.Clients
		if env.Plan.FrozenWaiter {
			c++
		}
		env.Go(func() { p.yieldEpisode(env, c) })
	}
	for c := range env.Plan.Clients {
		if env.Plan.TieBursts > 0 {
			env.Go(func() { p.tieBursts(env, c) })
		}
	}
	if env.Plan.CloseAt > 0 {
		env.Go(func() { p.closeEpisode(env, env.Plan.CloseClient) })
	}
	if env.Plan.GrantExpired {
		env.Go(func() { p.expiredGrant(env) })
	}
	env.Go(func() { p.sampler(env) })
}

// write offers a write to the register with fence, now.
func (p *LockProfile) write(env *Env, x *Hold) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ok := x.Fence >= p.highest[x.Resource]
	if ok {
		p.highest[x.Resource] = x.Fence
	}
	env.History.write(Write{Resource: x.Resource, Hold: x.ID, Fence: x.Fence, At: time.Now(), Applied: ok})
}

// nextGrid sleeps to a grid instant from 0 to max grid steps ahead.
func nextGrid(env *Env, r *rand.Rand, steps int) bool {
	now := time.Since(env.start)
	t := (now/grid + 1 + time.Duration(r.IntN(steps+1))) * grid
	return env.SleepUntil(env.At(t))
}

func (p *LockProfile) worker(env *Env, c int, r, r2 *rand.Rand) {
	rc := env.Clients[c]
	h := env.History
	for nextGrid(env, r, 50) {
		// Idle while the faults' leftovers expire: the quiet phase starts
		// from a settled cluster, and idle time costs nothing.
		if since := time.Since(env.start); since >= env.Plan.FaultPhase && since < env.Plan.Healed() {
			if !env.SleepUntil(env.At(env.Plan.Healed())) {
				return
			}
		}
		res := resourceName(r.IntN(env.Plan.Resources))
		op := r.IntN(20)
		switch {
		case op < 11:
			p.lockOnce(env, c, rc, r, r2, res, false)
		case op < 15:
			p.lockOnce(env, c, rc, r, r2, res, true)
		default:
			ctx, cancel := p.callCtx(env, r)
			w := h.wait(c, res, deadline(ctx))
			var x *Hold
			err := rc.Do(ctx, res, func(ctx context.Context) error {
				x = h.hold(c, res, "", -1, "Do")
				p.holdFor(env, r, x, ctx.Done(), nil, doneWhy(ctx), 0)
				h.endHold(x, time.Now(), "fn returned")
				return nil
			})
			cancel()
			h.endWait(w, x != nil)
			if x != nil {
				h.released(x, err)
			}
		}
	}
}

// callCtx is the ctx of a Lock call: until the run's end, or a timeout
// from half a TTL to two.
func (p *LockProfile) callCtx(env *Env, r *rand.Rand) (context.Context, context.CancelFunc) {
	if r.IntN(3) == 0 {
		return context.WithCancel(env.ctx)
	}
	return context.WithTimeout(env.ctx, env.Plan.TTL/2+time.Duration(r.Int64N(int64(2*env.Plan.TTL))))
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// lockOnce is one Lock (or TryLock) call, the hold and the Unlock; r2
// draws issue 42's choices (the plans' LongQuietHolds and DetachRace),
// so that r's draws stay those of the seeds before it.
func (p *LockProfile) lockOnce(env *Env, c int, rc *redlock.Client, r, r2 *rand.Rand, res string, try bool) {
	h := env.History
	ctx, cancel := p.callCtx(env, r)
	defer cancel()
	var w *Wait
	if !try {
		w = h.wait(c, res, deadline(ctx))
	}
	var l *redlock.Lock
	var err error
	if try {
		l, err = rc.TryLock(ctx, res)
	} else {
		l, err = rc.Lock(ctx, res)
	}
	if w != nil {
		h.endWait(w, err == nil)
	}
	if err != nil {
		return
	}
	op := "Lock"
	if try {
		op = "TryLock"
	}
	x := h.hold(c, res, l.Token(), l.Fence(), op)
	if !l.Valid() {
		h.Violate("invalid-lock", "c%d %s %s returned a lock with Valid() false (ValidUntil %v)", c, op, res, h.since(l.ValidUntil()))
	}
	// Handed locks held past their first renewal (issue 42): one Lock
	// hold in three in the quiet phase lasts 0.6-1.4 s, past a handoff's
	// reservation and its first renewal.
	var atLeast time.Duration
	if k := r2.IntN(3); env.Plan.LongQuietHolds && !try && k == 0 && time.Since(env.start) >= env.Plan.Healed() {
		atLeast = 600*time.Millisecond + time.Duration(r2.Int64N(int64(800*time.Millisecond)))
	}
	p.holdFor(env, r, x, l.Lost(), l, nil, atLeast)
	if env.Plan.Reentry && r2.IntN(8) == 0 {
		reentry(env, c, rc, l, res, try)
	}
	if env.Plan.Clients > 1 && r.IntN(10) == 0 && p.handOver(env, r, r2, c, x, l, ctx) {
		return
	}
	race := r.Float64() < env.Plan.ExtendRace
	var wg sync.WaitGroup
	// after: the Extend starts once the Unlock has begun (it must then
	// find the lock unusable, or be guarded against), a fake-time instant
	// to a millisecond later; else before it (below).
	after := time.Duration(-1)
	if race && r.IntN(3) == 0 {
		after = time.Duration(r.IntN(2)) * time.Duration(r.Int64N(int64(time.Millisecond)))
	}
	if race && after < 0 {
		// An Extend racing the Unlock: started first, on its own
		// goroutine, as a renewal of the caller's own would be.
		restore := p.slowExtend(env, r2, c)
		wg.Go(func() { _ = l.Extend(context.WithoutCancel(ctx)) })
		// Let it start: its requests then leave at the Unlock's
		// instant, and the jitter decides, per node, which lands first.
		runtime.Gosched()
		restore()
	}
	h.endHold(x, minTime(time.Now(), l.ValidUntil()), "unlock")
	if after >= 0 {
		wg.Go(func() {
			if after > 0 {
				time.Sleep(after)
			} else {
				runtime.Gosched()
			}
			_ = l.Extend(context.WithoutCancel(ctx))
		})
	}
	valid := l.Valid()
	err = l.Unlock(context.WithoutCancel(ctx))
	h.released(x, err)
	if err == nil && env.Plan.Cohort != nil {
		oldHandle(env, c, rc, x, l)
	}
	if valid && errors.Is(err, redlock.ErrNotHeld) {
		h.mu.Lock()
		x.NotHeld = true
		h.mu.Unlock()
	}
	wg.Wait()
	// A zombie's write: the holder, finished, writes once more with its
	// stale token (a process that did not learn of its loss would).
	if r.IntN(4) == 0 {
		p.write(env, x)
	}
}

// holdFor holds x for a while: writes at once and then every few grid
// steps, Extends sometimes, and ends the hold at a loss (lost closed, or
// ValidUntil passed). For Do (l nil), lost is fn's ctx, which also ends
// with the call's own ctx: why then says whether it was a loss.
func (p *LockProfile) holdFor(env *Env, r *rand.Rand, x *Hold, lost <-chan struct{}, l *redlock.Lock, why func() string, atLeast time.Duration) {
	h := env.History
	if x.Fence > 0 {
		p.write(env, x)
	}
	until := time.Now().Add(max(time.Duration(r.IntN(30))*grid, atLeast))
	for time.Now().Before(until) {
		tm := time.NewTimer(min(time.Until(until), time.Duration(1+r.IntN(8))*grid))
		select {
		case <-tm.C:
		case <-lost:
			tm.Stop()
			end := time.Now()
			if l != nil {
				end = minTime(end, l.ValidUntil())
			}
			w := "lost"
			if why != nil {
				w = why()
			}
			h.endHold(x, end, w)
			return
		case <-env.ctx.Done():
			tm.Stop()
			return
		}
		if l != nil {
			if !l.Valid() {
				h.endHold(x, minTime(time.Now(), l.ValidUntil()), "not valid")
				return
			}
			p.write(env, x)
			if r.IntN(8) == 0 {
				if err := l.Extend(env.ctx); err != nil && errors.Is(err, redlock.ErrLockLost) {
					h.endHold(x, minTime(time.Now(), l.ValidUntil()), "extend: lost")
					return
				}
			}
		}
	}
}

// doneWhy says why the ctx of Do's fn ended: "lost" when the lock was
// lost (its cause is ErrLockLost), "ctx done" when the call's own ctx
// ended first (its timeout, or the run's end). Before it, a Do granted
// just before its call's deadline was reported lost with no fault
// (spurious-loss: seed 453, 8 of 200 replays).
func doneWhy(ctx context.Context) func() string {
	return func() string {
		if errors.Is(context.Cause(ctx), redlock.ErrLockLost) {
			return "lost"
		}
		return "ctx done"
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// frozenWaiter is the frozen-waiter episode (Plan.FrozenWaiter): client c
// waits in Lock on resource 0 from early in the quiet phase; once it is
// queued and none of its requests is in flight, its pipes freeze for
// FrozenFor. A handoff to it must hold the others up by one reservation
// at most: the liveness bound covers the episode, with its waiting not
// counted while frozen. If its Lock returns while frozen (a grant that
// came in just before the freeze), it is a frozen holder, not a frozen
// waiter: the bound then skips the resource until its lease ran out.
func (p *LockProfile) frozenWaiter(env *Env, c int) {
	pl := env.Plan
	h := env.History
	res := resourceName(0)
	// A moment after the workers: someone holds, and it queues.
	if !env.SleepUntil(env.At(pl.Healed() + frozenWaiterAfter)) {
		return
	}
	rc := env.Clients[c]
	ctx, cancel := context.WithCancel(env.ctx)
	defer cancel()
	w := h.wait(c, res, time.Time{})
	done := make(chan struct{})
	var l *redlock.Lock
	var x *Hold
	env.Go(func() {
		defer close(done)
		var err error
		l, err = rc.Lock(ctx, res)
		h.endWait(w, err == nil)
		if err == nil {
			x = h.hold(c, res, l.Token(), l.Fence(), "Lock")
			if !l.Valid() {
				h.Violate("invalid-lock", "c%d Lock %s returned a lock with Valid() false", c, res)
			}
		}
	})
	finish := func() {
		cancel()
		<-done
		if x != nil {
			h.endHold(x, minTime(time.Now(), l.ValidUntil()), "unlock")
			h.released(x, l.Unlock(context.Background()))
		}
	}
	defer finish()
	// Queued (a refused attempt, then one that joins), then quiet: no
	// request of its own in flight, so that none lands after the freeze.
	ok := env.SleepUntil(time.Now().Add(2 * pl.RetryMax))
	for ok && !env.cl.net.idle(c, 10*time.Millisecond) {
		ok = env.SleepUntil(time.Now().Add(time.Millisecond))
	}
	select {
	case <-done:
		ok = false // it got the lock (or gave up) before the freeze: no episode
	default:
	}
	if !ok {
		return
	}
	from := time.Now()
	h.mu.Lock()
	w.Frozen[0] = from
	h.mu.Unlock()
	env.cl.net.freezeClient(c, true)
	env.faults.add(Fault{Kind: ClientFreeze, Client: c}, from, from.Add(pl.FrozenFor))
	h.Note("c%d (frozen waiter) frozen while waiting for %s", c, res)
	tm := time.NewTimer(pl.FrozenFor)
	got := false
	select {
	case <-tm.C:
	case <-done:
		got = true
		<-tm.C
	case <-env.ctx.Done():
		tm.Stop()
	}
	env.cl.net.freezeClient(c, false)
	h.Note("c%d (frozen waiter) thawed", c)
	h.mu.Lock()
	w.Frozen[1] = time.Now()
	if got {
		// A grant that came in just before the freeze: a frozen holder,
		// whose key holds the others up until its lease runs out.
		p.skip[res] = append(p.skip[res], [2]time.Time{from, time.Now().Add(pl.TTL)})
		h.noteLocked("c%d (frozen waiter) got the lock while frozen: a frozen holder, the bound skips %s", c, res)
	}
	h.mu.Unlock()
}

// frozenWaiterAfter is when, after the settling, the frozen waiter calls
// Lock (and the first burst of equal tickets comes, tieBursts).
const frozenWaiterAfter = 5 * grid

// handOver is the Detach/Resume workload (redlock/handover.go): client c
// Detaches its held lock x and another Client Resumes it with its token
// after 0-50 ms, holds it (holdFor) and Unlocks it. The hold of c ends at
// the Detach; the resumed one is a hold of its own (fence unknown: Resume
// does not carry it, so it writes nothing). A Resume that fails with
// ErrNotHeld gave the token up: its Released is then the failure's time,
// for the key-back check. false: nothing was handed over (the lock was not held any more),
// and the caller unlocks as usual.
func (p *LockProfile) handOver(env *Env, r, r2 *rand.Rand, c int, x *Hold, l *redlock.Lock, ctx context.Context) bool {
	h := env.History
	// In half the hand-overs of the plan's DetachLag, an Extend in flight
	// across the Detach, and a resumer that Unlocks within 20ms (aimed.go);
	// with the plan's DetachRace, half of them slow a single node other
	// than the last, and half start a second Extend while Detach waits
	// (aimed42.go).
	inFlight := env.Plan.DetachLag > 0 && r.IntN(2) == 0
	one, during := false, false
	if inFlight && env.Plan.DetachRace {
		one, during = r2.IntN(2) == 0, r2.IntN(2) == 0
	}
	if inFlight {
		defer extendInFlight(env, r, c, l, ctx, one)()
	}
	if during {
		if !detachRacing(env, c, l, ctx) {
			return false
		}
	} else if l.Detach() != nil {
		return false
	}
	h.endHold(x, minTime(time.Now(), l.ValidUntil()), "detach")
	to := (c + 1 + r.IntN(env.Plan.Clients-1)) % env.Plan.Clients
	pause := time.Duration(r.Int64N(int64(50 * time.Millisecond)))
	if inFlight {
		pause /= 50
	}
	if !env.SleepUntil(time.Now().Add(pause)) {
		h.released(x, nil)
		return true
	}
	detached := time.Now()
	// Each Resume's error is checked against what the nodes held at its
	// call (resume-honest); with the plan's ResumePause, half the
	// hand-overs pause a majority during the first Resume's re-arm.
	disarm := func() {}
	if env.Plan.ResumePause && r2.IntN(2) == 0 {
		disarm = resumePause(env, r2, to, x.Token)
	}
	evicted := -1
	if env.Plan.ResumeEvict && r2.IntN(2) == 0 {
		evicted = evictKey(env, r2, x)
	}
	called, before := detached, tokenOn(env, x.Resource, x.Token)
	l2, err := env.Clients[to].Resume(ctx, x.Resource, x.Token)
	disarm()
	checkResume(env, to, x, called, before, err)
	// ErrNoQuorum leaves the keys for a retry (by design): retry, as a
	// scheduler handing work over would, for up to half a TTL.
	for err != nil && errors.Is(err, redlock.ErrNoQuorum) && time.Since(detached) < env.Plan.TTL/2 {
		if !env.SleepUntil(time.Now().Add(env.Plan.RetryMax)) {
			break
		}
		if resumeNoQuorumDrops.Load() {
			dropToken(env, x)
		}
		checkLeftAlone(env, to, x, called, before, err)
		called, before = time.Now(), tokenOn(env, x.Resource, x.Token)
		l2, err = env.Clients[to].Resume(ctx, x.Resource, x.Token)
		checkResume(env, to, x, called, before, err)
	}
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		// Given up with the keys left: an orphan until their TTL, which
		// holds waiters up by design; the liveness bound skips it.
		h.mu.Lock()
		p.skip[x.Resource] = append(p.skip[x.Resource], [2]time.Time{detached, detached.Add(env.Plan.TTL)})
		h.mu.Unlock()
	}
	if err != nil {
		h.Note("c%d Resume of hold %d: %v", to, x.ID, firstLine(err))
		if errors.Is(err, redlock.ErrNotHeld) {
			// Given up, and released everywhere: no node may keep it
			// (key-back). After ErrNoQuorum the keys are left for a
			// retry, by design, until their TTL.
			h.released(x, err)
		}
		return true
	}
	x2 := h.hold(to, x.Resource, l2.Token(), -1, "Resume")
	if evicted >= 0 {
		env.Go(func() { checkHealed(env, to, x2, l2, evicted) })
	}
	if !l2.Valid() {
		h.Violate("invalid-lock", "c%d Resume %s returned a lock with Valid() false", to, x.Resource)
	}
	if inFlight {
		env.SleepUntil(time.Now().Add(time.Duration(r.Int64N(int64(20 * time.Millisecond)))))
	} else {
		var atLeast time.Duration
		if evicted >= 0 {
			atLeast = 2 * env.Plan.NodeTimeout // past resume-heal's look
		}
		p.holdFor(env, r, x2, l2.Lost(), l2, nil, atLeast)
	}
	h.endHold(x2, minTime(time.Now(), l2.ValidUntil()), "unlock")
	h.released(x2, l2.Unlock(context.WithoutCancel(ctx)))
	return true
}

// longHold is the plan's long-hold episode (LongHold): Lock (or Do) on
// its resource with the run's ctx, hold for lh.For writing to the fenced
// register, and lh.CutAfter into the hold freeze the Client or cut its
// links to a majority for lh.CutFor (longer than the TTL). The hold ends
// when Lost() closes (Do: when fn's ctx ends), as a user would act, or
// at lh.For with Unlock.
func (p *LockProfile) longHold(env *Env, lh *LongHold) {
	if !env.SleepUntil(env.At(lh.At)) {
		return
	}
	h := env.History
	c, rc, res := lh.Client, env.Clients[lh.Client], resourceName(lh.Resource)
	late := env.At(lh.At + time.Second)
	hold := func(x *Hold, lost <-chan struct{}, validUntil func() time.Time, why func() string) {
		if x.Fence > 0 {
			p.write(env, x)
		}
		if time.Now().After(late) {
			h.endHold(x, time.Now(), "unlock")
			return
		}
		cut := make(chan struct{})
		env.Go(func() { p.cut(env, lh, cut, validUntil) })
		defer close(cut)
		end := time.NewTimer(lh.For)
		defer end.Stop()
		for {
			tick := time.NewTimer(100 * time.Millisecond)
			select {
			case <-lost:
				tick.Stop()
				w := "lost"
				if why != nil {
					w = why()
				}
				h.endHold(x, time.Now(), w)
				return
			case <-end.C:
				tick.Stop()
				h.endHold(x, time.Now(), "unlock")
				return
			case <-env.ctx.Done():
				tick.Stop()
				h.endHold(x, time.Now(), "run over")
				return
			case <-tick.C:
				if x.Fence > 0 {
					p.write(env, x)
				}
			}
		}
	}
	// Granted within a second, or the hold ends at once: the episode's
	// cut must end before the quiet phase, whose liveness bound it would
	// break. (Not by a ctx timeout: Do's fn ctx is the call's.)
	ctx := env.ctx
	if lh.Do {
		var x *Hold
		err := rc.Do(ctx, res, func(ctx context.Context) error {
			x = h.hold(c, res, "", -1, "Do (long)")
			hold(x, ctx.Done(), nil, doneWhy(ctx))
			return nil
		})
		if x != nil {
			h.released(x, err)
		}
		return
	}
	if lh.SlowReply > 0 {
		// Every node's replies to the Client come late from the Lock call
		// on, until the cut starts (cut), the hold ends or the fault
		// phase does.
		p.slowReplies(env, lh, true)
		defer p.slowReplies(env, lh, false)
		env.Go(func() {
			env.SleepUntil(env.At(env.Plan.FaultPhase))
			p.slowReplies(env, lh, false)
		})
	}
	l, err := rc.Lock(ctx, res)
	if err != nil {
		return
	}
	x := h.hold(c, res, l.Token(), l.Fence(), "Lock (long)")
	if !l.Valid() {
		h.Violate("invalid-lock", "c%d Lock %s returned a lock with Valid() false", c, res)
	}
	hold(x, l.Lost(), l.ValidUntil, nil)
	h.released(x, l.Unlock(context.WithoutCancel(env.ctx)))
}

// slowReplies sets (on) or clears the long hold's slow replies
// (LongHold.SlowReply) on every link of its Client; clearing logs them as
// a delay fault of each link, once.
func (p *LockProfile) slowReplies(env *Env, lh *LongHold, on bool) {
	n := env.cl.net
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.slowFrom = time.Now()
		env.History.Note("long hold: c%d's replies slowed %v", lh.Client, lh.SlowReply)
	} else if p.slowFrom.IsZero() {
		return
	}
	for i := range env.Plan.Nodes {
		d := time.Duration(0)
		if on {
			d = lh.SlowReply
		} else {
			env.faults.add(Fault{Kind: LinkDelay, Client: lh.Client, Node: i}, p.slowFrom, time.Now())
		}
		n.setReplyDelay(lh.Client, i, d)
	}
	if !on {
		p.slowFrom = time.Time{}
	}
}

// cut is the long hold's fault: lh.CutAfter after the grant (with slow
// replies: the instant its first renewal succeeded, validUntil moving),
// for lh.CutFor, or until stop (the hold ended) and the run's end,
// whichever comes last but the run's end.
func (p *LockProfile) cut(env *Env, lh *LongHold, stop <-chan struct{}, validUntil func() time.Time) {
	n := env.cl.net
	wait := func(d time.Duration) bool {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return true
		case <-stop:
		case <-env.ctx.Done():
		}
		return false
	}
	if lh.SlowReply > 0 && validUntil != nil {
		// Polled every millisecond of fake time from just before the
		// first renewal is due (a renew interval, TTL/3, after the grant):
		// the cut starts within one of the renewal's decision, far inside
		// the reply's delay.
		first := validUntil()
		if !wait(env.Plan.TTL/3 - 10*time.Millisecond) {
			return
		}
		for validUntil().Equal(first) {
			if !wait(time.Millisecond) {
				return
			}
		}
		p.slowReplies(env, lh, false)
	} else if !wait(lh.CutAfter) {
		return
	}
	from := time.Now()
	// Healed a TTL and 1.5 s before the quiet phase starts, as the
	// plan's faults are (Plan.drawMore lengthens the settling).
	until := minTime(from.Add(lh.CutFor), env.At(env.Plan.Healed()-env.Plan.TTL-1500*time.Millisecond))
	if !until.After(from) {
		return
	}
	if lh.Freeze {
		env.faults.add(Fault{Kind: ClientFreeze, Client: lh.Client}, from, until)
		n.freezeClient(lh.Client, true)
	} else {
		for _, i := range lh.Cut {
			env.faults.add(Fault{Kind: LinkDelay, Client: lh.Client, Node: i}, from, until)
			n.cutLink(lh.Client, i, true)
		}
	}
	env.History.Note("long hold: c%d %s", lh.Client, lh)
	env.SleepUntil(until)
	if lh.Freeze {
		n.freezeClient(lh.Client, false)
	} else {
		for _, i := range lh.Cut {
			n.cutLink(lh.Client, i, false)
		}
	}
	env.History.Note("long hold: c%d's cut healed", lh.Client)
}

// sampler reads every lock key on every node every TTL/20 and once at the
// end, directly from the nodes, for keys that hold the token of a lock
// whose Unlock had returned (at rel):
//
//   - left: the key is still there TTL/2 after rel (its release never
//     landed, or a request of ours set it again right after);
//   - back: its PTTL says a request of ours wrote it (for the TTL) more
//     than 20ms after rel, and it is seen TTL/2 after that write (not a
//     write that a release still in flight deleted).
//
// Either is a violation, unless the node, or the holder's connections to
// it, or the holder, was under a fault — a pause, slowness, kill or wipe,
// a reset or a long delay, a freeze — from its start to one TTL and a
// second after its end: until the release lands there, the key may stay,
// or our queue entry may get it handed for one reservation (the chaos
// checker's allowance, docs/reliability.md). Short spikes get none: what
// they hold lands soon, and the release right after it.
func (p *LockProfile) sampler(env *Env) {
	pl := env.Plan
	h := env.History
	seen := make(map[string]bool)
	every := pl.TTL / 20
	if pl.Trace {
		every = time.Millisecond
	}
	last := make(map[string]string)
	for {
		stop := !env.SleepUntil(time.Now().Add(every))
		for i := range pl.Nodes {
			m := env.cl.node(i)
			if m == nil {
				continue
			}
			env.cl.tick(i, m)
			for ri := range pl.Resources {
				key := redlock.DefaultKeyPrefix + resourceName(ri)
				tok, err := m.Get(key)
				if pl.Trace {
					k := fmt.Sprint(key, i)
					if tok != last[k] {
						last[k] = tok
						who := "none"
						if x := h.byToken(tok); x != nil {
							who = fmt.Sprintf("hold %d", x.ID)
						} else if tok != "" {
							who = "token " + tok[:8]
						}
						h.Note("n%d %s: %s (ttl %v)", i, key, who, m.TTL(key))
					}
				}
				if err != nil || tok == "" {
					continue
				}
				x := h.byToken(tok)
				if x == nil {
					p.givenUp(env, i, key, tok, seen)
					continue
				}
				h.mu.Lock()
				rel := x.Released
				h.mu.Unlock()
				if rel.IsZero() {
					continue
				}
				ttl := m.TTL(key)
				now := time.Now()
				written := now.Add(-env.cl.clientDur(i, pl.TTL-ttl)) // the node's clock drifts
				left := now.Sub(rel) >= pl.TTL/2
				back := written.After(rel.Add(20*time.Millisecond)) && now.Sub(written) >= pl.TTL/2
				if !left && !back || env.faults.allows(x.Client, i, now, pl.TTL+time.Second) {
					continue
				}
				if k := fmt.Sprint(tok, i); !seen[k] {
					seen[k] = true
					h.Violate("key-back", "%s on node %d: the key of hold %d (c%d), unlocked at %v, is there at %v with %v left (written at %v or later)",
						key, i, x.ID, x.Client, h.since(rel), h.since(now), ttl, h.since(written))
				}
			}
		}
		if stop {
			return
		}
	}
}

// givenUp checks a key on node i that holds a token of no hold of the
// history: a Lock call's token while it waits, a Do's, or one the
// Client gave up (an attempt abandoned, a grant yielded, a call that
// failed; issue 30's key-back check for every token given up). No
// request carrying it reached the node for givenUpAfter: a live waiter
// attempts again within a retry delay and three node timeouts, a live
// holder renews every TTL/3, and a key handed to a queue entry lasts a
// reservation after the entry's lapse (queueLife, after the waiter's last
// attempt there) — all within it. So the key is one of a token given
// up, left behind or set again by a late request, unless a fault
// explains it (faultLog.allows, as for released holds).
func (p *LockProfile) givenUp(env *Env, i int, key, tok string, seen map[string]bool) {
	pl := env.Plan
	td, c, ok := env.cl.net.lastDelivered(tok, i)
	now := time.Now()
	if !ok || now.Sub(td) < givenUpAfter(pl) || env.faults.allows(c, i, now, pl.TTL+time.Second) || env.faults.paused(td, now) {
		return
	}
	if k := fmt.Sprint(tok, i); !seen[k] {
		seen[k] = true
		m := env.cl.node(i)
		var ttl time.Duration
		if m != nil {
			ttl = m.TTL(key)
		}
		env.History.Violate("key-back", "%s on node %d: token %.8s of c%d (no hold: an attempt or call given up) is there at %v with %v left, its last request there delivered at %v",
			key, i, tok, c, env.History.since(now), ttl, env.History.since(td))
	}
}

// givenUpAfter is how long after the last request carrying a token that
// is no hold's reached a node its key may still be there (givenUp): half
// a TTL, above a queue entry's life plus a reservation (1.22s at the
// plan's options) and a renew interval.
func givenUpAfter(p Plan) time.Duration { return p.TTL / 2 }

// Check checks the liveness bound over the quiet phase.
func (p *LockProfile) Check(env *Env) {
	pl := env.Plan
	// spurious-loss: a lock the library said was lost while no fault of
	// any kind (a spike, the long hold's cut, the frozen waiter's freeze
	// too) was under way from a TTL before it was granted to its end.
	h := env.History
	h.mu.Lock()
	for _, x := range h.holds {
		// unlock-not-held: Unlock of a lock still valid when it was
		// called returned ErrNotHeld ("no node held our token") with no
		// fault of any kind from a TTL before its grant to its release:
		// a valid lock's token stands on a majority, and any majority
		// that confirms the release meets it (DESIGN's Unlock contract).
		if x.NotHeld && !env.faults.any(x.Start.Add(-pl.TTL), x.Released) {
			h.viol = append(h.viol, Violation{"unlock-not-held", h.since(x.Released), fmt.Sprintf("%s: hold %d (c%d %s, from %v): Unlock called while Valid() returned ErrNotHeld at %v with no fault in the run since %v",
				x.Resource, x.ID, x.Client, x.Op, h.since(x.Start), h.since(x.Released), h.since(x.Start.Add(-pl.TTL)))})
		}
		if x.Lost && !env.faults.excuses(x.Client, x.Start.Add(-pl.TTL), x.End) {
			h.viol = append(h.viol, Violation{"spurious-loss", h.since(x.End), fmt.Sprintf("%s: hold %d (c%d %s, from %v) lost at %v with no fault on a node or of its Client since %v",
				x.Resource, x.ID, x.Client, x.Op, h.since(x.Start), h.since(x.End), h.since(x.Start.Add(-pl.TTL)))})
		}
	}
	if pl.Cohort != nil {
		h.checkCohort(pl.Cohort)
	}
	h.mu.Unlock()
	env.History.checkLiveness(env.At(pl.Healed()), env.At(pl.Duration()), pl.WaitBound(), p.skip)
}
