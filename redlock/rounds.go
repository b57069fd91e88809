package redlock

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// This file is the registry of a lock's requests that may still land on a
// node (DESIGN step 4). One rule, kept here and nowhere else: a round is
// registered — and its start, hence its deadline and every request's
// not-after bound, fixed — before any point where it can be delayed (a
// goroutine switch, a queue, a retry). register does both under l.mu, in
// one step with the check that the lock may send it; startRound sends it
// from the start fixed there. So a round registered before a release has
// its deadline at most a node timeout after the release, whenever its
// goroutine gets to send it, and the release's guard (guardFor) covers it;
// a round that would come after the release is never registered, so never
// sent.

// inflight is a round of requests of this lock, seen by release: where a
// node has not answered it, a request may still land after the release.
type inflight interface {
	answered(i int) bool // node i's reply is in (not a timeout or a connection error)
	settled() bool       // every node has answered or given up
}

// pendingRound is a registered round (register): unanswered everywhere
// until attach gives it its requests. start is write-once, before the
// round is visible to anyone.
type pendingRound struct {
	start time.Time
	r     atomic.Pointer[inflight]
	done  chan struct{} // closed by attach or by abort: Detach waits for it
}

func (p *pendingRound) attach(r inflight) {
	p.r.Store(&r)
	close(p.done)
}

// abort marks a registered round that sent nothing (its check failed
// after registration): every node counts as answered.
func (p *pendingRound) abort() { p.attach(sentNothing{}) }

func (p *pendingRound) answered(i int) bool {
	r := p.r.Load()
	return r != nil && (*r).answered(i)
}

func (p *pendingRound) settled() bool {
	r := p.r.Load()
	return r != nil && (*r).settled()
}

// sentNothing is the round of an aborted registration.
type sentNothing struct{}

func (sentNothing) answered(int) bool { return true }
func (sentNothing) settled() bool     { return true }

// register registers a round of l before anything of it is sent, and fixes
// its start. With held, it does so only in one step with the check that the
// lock is held and valid (under l.mu, as Unlock's and Detach's finish
// change the state): a release that comes later sees the round pending —
// every node unanswered, so it leaves the guard — and a round that would
// come after the release is never registered; it then returns the error of
// usable. Without held (an acquire attempt, Resume's rounds: the lock is
// not handed out yet, and its release comes from the same goroutine after
// the round), it always registers.
func (l *Lock) register(held bool) (*pendingRound, error) {
	for {
		l.mu.Lock()
		if !held || l.state == stateHeld && time.Now().Before(l.validUntil) {
			p := &pendingRound{start: time.Now(), done: make(chan struct{})}
			l.trackLocked(p)
			l.mu.Unlock()
			return p, nil
		}
		l.mu.Unlock()
		if err := l.usable(); err != nil {
			return nil, err
		}
	}
}

// startRound sends a registered round (register) to every node, from the
// start fixed at registration: its requests' deadline is p.start plus
// timeout, however late this goroutine runs (see quorum.StartAt).
func startRound[T any](ctx context.Context, l *Lock, p *pendingRound, timeout time.Duration, fn func(ctx context.Context, i int) (T, error)) *quorum.Round[T] {
	c := l.c
	r := quorum.StartAt(ctx, p.start, len(c.nodes), timeout, &c.wg, fn)
	p.attach(roundRef[T]{r})
	return r
}

// round registers a round of l and sends it (register, startRound).
func round[T any](ctx context.Context, l *Lock, held bool, timeout time.Duration, fn func(ctx context.Context, i int) (T, error)) (*quorum.Round[T], error) {
	p, err := l.register(held)
	if err != nil {
		return nil, err
	}
	return startRound(ctx, l, p, timeout, fn), nil
}

// roundRef is a round of this lock alone.
type roundRef[T any] struct{ r *quorum.Round[T] }

func (p roundRef[T]) answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && answered(rep.Err) // a request never sent (see unsent) cannot land either
}

func (p roundRef[T]) settled() bool { return p.r.Settled() }

// answered reports whether a request that ended with err can no longer
// change anything on the node: the node replied (a result, an error reply,
// or scripts.ErrLate: it ran past its not-after bound and changed nothing),
// or the request provably never left the client (see unsent). A timeout or
// a broken connection leaves it unknown whether (and when) the request
// reaches the node.
func answered(err error) bool {
	if err == nil {
		return true // before the errors.As target, which escapes
	}
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, scripts.ErrLate) || unsent(err)
}

// guardFor returns how long node i must refuse requests of this lock after
// its release: 0 when every request of the lock there has been answered
// (none can land later), else the guard's lifetime (see guardTTL).
func (l *Lock) guardFor(i int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	unsure := l.unsure != nil && l.unsure[i]
	for _, r := range l.rounds {
		unsure = unsure || !r.answered(i)
	}
	if unsure {
		return l.guardTTL()
	}
	return 0
}

// guardTTL is how long a release's guard stays: until no request of ours
// can land on a node with its not-after bound still ahead of the node's
// clock (clock.go guardLifetime: about a node timeout plus the clock
// estimates' error; twice the TTL for a node that was sent a request
// without a bound). A request that lands later is refused by its bound,
// however late. The guard is a key of its own, so it keeps nobody else
// waiting.
func (l *Lock) guardTTL() time.Duration {
	if testhooks.SkipReleaseGuard.Load() {
		return 0 // a negative control of the chaos checker
	}
	return l.c.guardLifetime(l.cfg.ttl, l.cfg.timeout())
}

// waitOut waits until no request of l can land on any node any more:
// every registered round has been sent and has settled, or passed its
// deadline, and, where a request went unanswered, for as long as the
// release's guard would stay (guardFor), by which time the node's clock has
// passed its not-after bound. Detach calls it: the lock's next owner knows
// nothing of our requests, so they must be over before it is handed on. It
// takes at most about twice the node timeout plus the clock estimates'
// error; nothing when every request was answered.
func (l *Lock) waitOut() {
	l.mu.Lock()
	rounds := append([]inflight(nil), l.rounds...)
	l.mu.Unlock()
	timeout := l.cfg.timeout()
	for _, r := range rounds {
		if w, ok := r.(interface{ waitUntil(time.Time) }); ok {
			if p, ok := r.(*pendingRound); ok {
				<-p.done // its sender attaches it without blocking
				w.waitUntil(p.start.Add(timeout))
			}
		}
	}
	var g time.Duration
	for i := range l.keys {
		g = max(g, l.guardFor(i))
	}
	if g > 0 {
		time.Sleep(g)
	}
}

// waitUntil waits until every request of the round has answered or given
// up, or until deadline.
func (p *pendingRound) waitUntil(deadline time.Time) {
	if r := p.r.Load(); r != nil {
		if w, ok := (*r).(interface{ waitUntil(time.Time) }); ok {
			w.waitUntil(deadline)
		}
	}
}

func (p roundRef[T]) waitUntil(deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for i := range p.r.N() {
		select {
		case <-p.r.Done(i):
		case <-t.C:
			return
		}
	}
}

// markUnsure remembers for good that a request of l to node i went
// unanswered: it may land at any later time, so the release there leaves
// the token's guard.
func (l *Lock) markUnsure(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.markUnsureLocked(i)
}

func (l *Lock) markUnsureLocked(i int) {
	if l.unsure == nil {
		l.unsure = make([]bool, len(l.keys))
	}
	l.unsure[i] = true
}

// track remembers a round until all its requests have answered or given
// up; a node that gave up on one is remembered in unsure for good (its
// request may land at any later time).
func (l *Lock) track(r inflight) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.trackLocked(r)
}

func (l *Lock) trackLocked(r inflight) {
	keep := l.rounds[:0]
	for _, old := range l.rounds {
		if !old.settled() {
			keep = append(keep, old)
			continue
		}
		for i := range l.keys {
			if !old.answered(i) {
				l.markUnsureLocked(i)
			}
		}
	}
	clear(l.rounds[len(keep):])
	l.rounds = append(keep, r)
}
