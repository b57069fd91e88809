package chaos

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// worker is one lock client: its own redlock.Client over its own node
// clients (so that a gate can pause it alone), with auto-renew and fencing
// on, as the library is meant to be used.
type worker struct {
	id   int
	e    *env
	cl   *redlock.Client
	gate *gate
	rng  *rand.Rand // used by the worker's goroutine only

	pauseFor atomic.Int64 // a client pause the nemesis asked for, taken by the next critical section
}

func newWorker(e *env, id int) (*worker, error) {
	nodes := e.cluster.Clients()
	g := newGate()
	for _, n := range nodes {
		n.(*redis.Client).AddHook(g)
	}
	h := e.hist
	cl, err := redlock.New(nodes,
		redlock.WithTTL(e.cfg.TTL),
		redlock.WithFencing(true),
		redlock.WithOnLost(func(l *redlock.Lock, _ error) { h.onLostCall(l, time.Now()) }),
	)
	if err != nil {
		return nil, err
	}
	return &worker{id: id, e: e, cl: cl, gate: g, rng: e.rand(uint64(id) + 1)}, nil
}

// held is a lock a worker holds, with a watcher that records when Lost()
// is closed.
type held struct {
	w     *worker
	l     *redlock.Lock
	id    int    // Hold.ID
	tok   *token // its entry in env.tokens
	done  chan struct{}
	watch sync.WaitGroup
}

// lock acquires resource (one attempt with try) and records the hold. A
// failed call is counted by outcome.
func (w *worker) lock(ctx context.Context, resource string, try bool) (*held, error) {
	var (
		l   *redlock.Lock
		err error
	)
	lockFn, tryFn := w.cl.Lock, w.cl.TryLock
	if w.e.cfg.RW {
		// Read-write locks, readers:writers 9:1 (issue 24).
		lockFn, tryFn = w.cl.WLock, w.cl.TryWLock
		if w.rng.IntN(10) != 0 {
			lockFn, tryFn = w.cl.RLock, w.cl.TryRLock
		}
	}
	if try {
		l, err = tryFn(ctx, resource)
	} else {
		w.e.waiting.Add(1)
		start := time.Now()
		l, err = lockFn(ctx, resource)
		w.e.hist.wait(Wait{Resource: resource, Start: start, End: time.Now()})
		w.e.waiting.Add(-1)
	}
	now := time.Now()
	if err != nil {
		w.e.hist.failedLock(outcome(err))
		return nil, err
	}
	return w.track(l, now), nil
}

// track records the hold of l, returned by Lock (or a semaphore's Acquire)
// at now, and watches its Lost().
func (w *worker) track(l *redlock.Lock, now time.Time) *held {
	// Read at once: Lock and TryLock must never return a lock that is not
	// valid.
	valid, validUntil := l.Valid(), l.ValidUntil()
	tok := &token{hold: w.e.hist.begin(w.id, l, now, valid, validUntil)}
	h := &held{w: w, l: l, id: tok.hold, tok: tok, done: make(chan struct{})}
	w.e.tokens.Store(l.Token(), tok)
	h.watch.Go(func() {
		select {
		case <-l.Lost():
			w.e.hist.lost(h.id, time.Now())
		case <-h.done:
		}
	})
	return h
}

// outcome names a failed Lock call's error for the report's counts.
// ErrAlreadyHeld (which also matches ErrNotObtained) is its own: no
// worker calls Lock under a ctx of a lock it holds, so a call that
// returns it is a defect (see unexpected), not contention.
func outcome(err error) string {
	switch {
	case errors.Is(err, redlock.ErrAlreadyHeld):
		return outcomeAlreadyHeld
	case errors.Is(err, redlock.ErrNotObtained):
		return "not_obtained"
	case errors.Is(err, redlock.ErrNoQuorum):
		return "no_quorum"
	case errors.Is(err, redlock.ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "error"
}

// outcomeAlreadyHeld is outcome's name for ErrAlreadyHeld.
const outcomeAlreadyHeld = "already_held"

// unexpected reports whether a failed call's outcome is one no fault
// explains (its error is logged): an error of no known kind, or
// ErrAlreadyHeld.
func unexpected(outcome string) bool {
	return outcome == "error" || outcome == outcomeAlreadyHeld
}

// write offers one write to the register with this hold's token. A read
// lock does not write (it is not fenced): it returns false.
func (h *held) write(zombie bool) bool {
	if h.l.Mode() == redlock.ModeRead {
		return false
	}
	return h.w.e.reg.Write(h.l.Resource(), h.w.id, h.id, h.l.Fence(), zombie)
}

// unlock calls Unlock, then records the end of the hold.
func (h *held) unlock() {
	at := time.Now()
	// A failed Unlock (ErrNotHeld after a loss, ErrNoQuorum under faults)
	// is expected here; the checker judges the hold by its times.
	_ = h.l.Unlock(context.Background())
	released := time.Now()
	h.tok.released.Store(&released)
	close(h.done)
	h.watch.Wait()
	h.w.e.hist.end(h.id, h.l, at, released, h.l.ValidUntil())
}

// pause is a client pause: having just checked that its lock is valid, the
// holder stops, gate shut and goroutine asleep, for d; its lease runs out
// meanwhile. Woken, it waits (at most wait) until another holder has written
// with a newer token, the worst moment to act on its stale belief, and then
// writes with its old token, as a paused process would. If nobody took over,
// or ctx ended, it does not write: there would be nothing to show.
func (h *held) pause(ctx context.Context, d, wait time.Duration) {
	w := h.w
	if !h.l.Valid() {
		return
	}
	start := time.Now()
	defer func() { w.e.hist.fault(Fault{Kind: KindClientPause, Client: w.id, Start: start, End: time.Now()}) }()
	w.gate.shut()
	slept := sleepCtx(ctx, d)
	w.gate.release()
	if !slept {
		return
	}
	res := h.l.Resource()
	deadline := time.Now().Add(wait)
	for w.e.reg.Highest(res) <= h.l.Fence() {
		if !time.Now().Before(deadline) || !sleepCtx(ctx, 5*time.Millisecond) {
			return
		}
	}
	h.write(true)
}

// loop is the worker's life in a randomized profile: pick a resource, lock
// it, write to the register while the lock is valid for a random time,
// unlock; until ctx is done.
func (w *worker) loop(ctx context.Context) {
	cfg := w.e.cfg
	for ctx.Err() == nil {
		res := resourceName(w.rng.IntN(cfg.Resources))
		lctx, cancel := context.WithTimeout(ctx, 4*cfg.TTL)
		h, err := w.lock(lctx, res, false)
		cancel()
		if err != nil {
			if unexpected(outcome(err)) {
				w.e.logf("chaos: client %d: Lock(%q): %v", w.id, res, err)
			}
			continue
		}
		w.critical(ctx, h)
		h.unlock()
	}
}

// critical is the critical section: a first write at once (it fences out
// older holders), then writes at random intervals while the lock is valid.
func (w *worker) critical(ctx context.Context, h *held) {
	cfg := w.e.cfg
	// Most critical sections are short, so that locks change hands often;
	// one in eight is long, so that it lives through renewals.
	d := randDur(w.rng, cfg.HoldMin, cfg.HoldMax)
	if w.rng.IntN(8) != 0 {
		d = randDur(w.rng, cfg.HoldMin, cfg.HoldMin+cfg.TTL/10)
	}
	end := time.Now().Add(d)
	for {
		if !h.l.Valid() || ctx.Err() != nil {
			return
		}
		h.write(false)
		if d := time.Duration(w.pauseFor.Swap(0)); d > 0 {
			h.pause(ctx, d, 3*cfg.TTL)
			return
		}
		if !time.Now().Before(end) {
			return
		}
		sleepCtx(ctx, randDur(w.rng, 0, cfg.TTL/10))
	}
}

func (w *worker) close() error { return w.cl.Close() }

// env is what the workers and the nemesis of one run share.
type env struct {
	cfg     Config
	cluster *redistest.Cluster
	hist    *History
	reg     *Register
	logf    func(format string, args ...any)
	// tokens maps the token of every lock handed out to its *token: to
	// tell keys left by held locks from keys left by failed attempts, and
	// keys of released locks from keys of held ones. Tokens are never
	// printed.
	tokens sync.Map
	// waiting counts the clients blocked in Lock right now.
	waiting atomic.Int32
	// wakeUps counts the messages the raw subscribers received.
	wakeUps atomic.Int64
}

// token is what the harness knows of one lock's token.
type token struct {
	hold     int                       // Hold.ID; written before the token is stored
	released atomic.Pointer[time.Time] // when Unlock returned; nil before
}

// releasedAt returns the hold of the lock of token v and when it was
// released (Unlock returned); ok is false if no lock handed out had that
// token, or it was not released yet.
func (e *env) releasedAt(v string) (hold int, at time.Time, ok bool) {
	x, found := e.tokens.Load(v)
	if !found {
		return 0, time.Time{}, false
	}
	t := x.(*token)
	p := t.released.Load()
	if p == nil {
		return t.hold, time.Time{}, false
	}
	return t.hold, *p, true
}

// rand returns a new generator seeded from the run's seed and stream.
func (e *env) rand(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(e.cfg.Seed, stream))
}

func resourceName(i int) string { return "r" + strconv.Itoa(i) }

// randDur returns a duration uniform in [lo, hi).
func randDur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}

// sleepCtx sleeps for d or until ctx is done, and reports whether it slept
// the whole time.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
