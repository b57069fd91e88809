package redlock

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// waiting is the acquisition of one Lock call, apart from the lease it
// may produce (the Lock): how it waits between its attempts (DESIGN step
// 9): its place in the queue on the nodes (the ticket, and this Client's
// wake-up registration), the retry delay, and what the last wait brought —
// a key handed over by a majority of releases, which makes the lock ours
// without a round; and what its attempts with the current token did
// (queuedAt, yielded, queueSent, starts: reset with the token, retoken).
// Only the call's goroutine touches it.
type waiting struct {
	c      *Client
	cfg    config
	ticket int64 // taken once per call: (ticket, member) orders the queue
	w      *waiter
	delay  backoff.BackOff
	timer  *time.Timer
	// handedUntil is set when the last wait ended with the key handed to
	// us on a majority: how long that majority's reservations last.
	handedUntil time.Time
	// queuedAt is when the first attempt that queued this token started
	// (zero: none yet): a key handed to the token was set after it, for
	// the reservation.
	queuedAt time.Time
	// yielded is set once giveBack yielded a node of this token: a handoff
	// message from before the yield may then name a node that is no
	// longer ours, so the call confirms with an attempt instead.
	yielded bool
	// queueSent is set once an acquire carrying the token's member was
	// sent: until then no entry of it can be queued on any node, and the
	// acquire script does not look for one (scripts.Waiter.Fresh).
	queueSent bool
	// starts are when this token's latest attempts began, by attempt
	// number (a ring): a handoff that names an attempt was set after it
	// began (see handoffValidity).
	starts [8]attemptStart
}

// attemptStart is when attempt n of a Lock call began.
type attemptStart struct {
	n  int64
	at time.Time
}

// testTicket, set by tests only, replaces the clock as the source of
// tickets (to make two calls take the same one).
var testTicket atomic.Pointer[func() int64]

// startWaiting takes the call's ticket. A Client that has waited before
// listens already: the call then queues from its first attempt, which
// saves a refused round under contention.
func (c *Client) startWaiting(ctx context.Context, l *Lock, cfg config) (*waiting, error) {
	q := &waiting{c: c, cfg: cfg, ticket: time.Now().UnixMicro(), delay: jitter{cfg.retryMin, cfg.retryMax}}
	if f := testTicket.Load(); f != nil {
		q.ticket = (*f)()
	}
	if cfg.wakeUp && c.wake.awaitReady(ctx, 0) {
		w, err := c.wake.join(l.token)
		if err != nil {
			return nil, err
		}
		q.w = w
		l.waiter = c.queued(l, q.ticket)
	}
	if queuesFor(cfg.mode) {
		// Read-write calls record their waiting on the nodes from their
		// first attempt (rw.lua: fairness), and listen for the releases
		// that tell them to attempt now (rw.lua wake; see wait).
		w, err := c.wake.join(l.token)
		if err != nil {
			return nil, err
		}
		q.w = w
		l.waiter = c.queued(l, q.ticket)
	}
	return q, nil
}

// stop ends the call's waiting: its timer, and its wake-up registration.
func (q *waiting) stop() {
	if q.timer != nil {
		q.timer.Stop()
	}
	if q.w != nil {
		q.w.leave()
	}
}

// queued is how l's Lock call, with its ticket, waits in the queue on the
// nodes (step 9): a release hands its token the key for the reservation.
func (c *Client) queued(l *Lock, ticket int64) scripts.Waiter {
	reserve := l.cfg.reservation()
	if testhooks.HandoffFullTTL.Load() {
		reserve = l.cfg.ttl // a negative control: the handoff before the reservation
	}
	return scripts.Waiter{Member: scripts.Member(c.id, reserve, l.token), Ticket: ticket, Lapse: testhooks.Lapse(l.cfg.queueLife())}
}

// step is the call's next attempt: a round on the nodes, or, when the last
// wait ended with the key handed to us on a majority, holding it from the
// handoffs (validity: their reservations, see handoffValidity).
func (q *waiting) step(ctx context.Context, callID uint64, l *Lock, attempt int) outcome {
	c := q.c
	if until := q.handedUntil; !until.IsZero() {
		q.handedUntil = time.Time{}
		err := c.hold(ctx, l, until, testhooks.FirstRenewal(firstRenewal(q.cfg, until), until))
		if obs := q.cfg.obs; obs != nil {
			obs.Attempt(ctx, AttemptInfo{Call: callID, Resource: l.resource, Granted: q.w.handed(l.token), Quorum: c.quorum,
				Nodes: len(c.nodes), Outcome: outcomeOf(err), Err: err, Handoff: true})
		}
		return outcome{err: err, settled: true}
	}
	w := l.waiter
	if w.Member == "" {
		return c.attempt(ctx, callID, l, w, nil)
	}
	l.waiter.Attempt = int64(attempt)
	w.Attempt = l.waiter.Attempt
	if q.queuedAt.IsZero() {
		q.queuedAt = time.Now() // before the round starts: a lower bound
	}
	w.Fresh = !q.queueSent
	q.queueSent = true
	var h *inFlight
	if q.w != nil && !queuesFor(q.cfg.mode) && !l.cfg.fencing && l.cfg.autoRenew {
		h = &inFlight{q: q, l: l, attempt: w.Attempt, before: q.w.handedAttempts(l.token), woken: len(q.w.c) > 0}
	}
	o := c.attempt(ctx, callID, l, w, h)
	if o.r != nil {
		q.noteStart(w.Attempt, o.r.Started())
	}
	return o
}

// noteDequeued records the nodes whose handoff to l took its entry out
// there, as written by its latest attempt (l.dequeued): no later request of
// l carries its member, so its release need not look for an entry there.
func (q *waiting) noteDequeued(l *Lock) {
	if q.w == nil || l.waiter.Member == "" || queuesFor(q.cfg.mode) {
		return
	}
	att := q.w.handedAttempts(l.token)
	for i, a := range att {
		if a == l.waiter.Attempt && a > 0 {
			if l.dequeued == nil {
				l.dequeued = make([]bool, len(att))
			}
			l.dequeued[i] = true
		}
	}
}

// firstRenewal is when a lock held from handoffs renews first: halfway to
// the last node timeout of its validity, so that the renewal, which sets
// the key to its TTL, lands within the reservations (step 9). A lock held
// for its TTL renews at the interval.
func firstRenewal(cfg config, until time.Time) time.Duration {
	return max((time.Until(until)-cfg.nodeTimeout)/2, time.Millisecond)
}

// retoken replaces the call's lock with one of a fresh token, queued with
// the same ticket; the waiter follows the new token. It fails only if no
// token can be made.
func (q *waiting) retoken(old *Lock) (*Lock, error) {
	l, err := q.c.newLock(old.resource, old.cfg, "")
	if err != nil {
		return nil, err
	}
	if old.waiter.Member != "" {
		l.waiter = q.c.queued(l, q.ticket)
	}
	// What the attempts did was the old token's.
	q.queuedAt, q.yielded, q.queueSent, q.starts = time.Time{}, false, false, [8]attemptStart{}
	if q.w != nil {
		q.w.retoken(l.token)
	}
	return l, nil
}

// wait is what a Lock call does after a failed attempt whose error is
// err: after its first refusal it starts waiting in the queue (subscribe
// this Client's channel, once per Client; queue on the nodes with the next
// attempt, made at once); otherwise it sleeps the retry delay, cut short
// when releases hand it the key. It returns an error only when the call
// must end (acquire's exit 9: the registration failed, ctx done, Client
// closed); acquire then abandons l.
func (q *waiting) wait(ctx context.Context, l *Lock, t quorum.Tally, err error) error {
	c := q.c
	if q.w == nil && q.cfg.wakeUp && errors.Is(err, ErrNotObtained) {
		w, jerr := c.wake.join(l.token)
		if jerr != nil {
			return jerr
		}
		q.w = w
		if c.wake.awaitReady(ctx, q.cfg.nodeTimeout) {
			l.waiter = c.queued(l, q.ticket)
		}
		return nil
	}
	if q.w != nil && l.waiter.Member == "" && c.wake.awaitReady(ctx, 0) {
		l.waiter = c.queued(l, q.ticket)
	}
	d := q.delay.NextBackOff()
	if l.waiter.Member == "" && t.Yes > 0 && t.No < c.quorum && q.cfg.mode != ModeMulti {
		// A split vote without a queue: nobody holds the lock on a
		// majority, but the others that lost it too will retry; a short
		// random pause breaks the tie sooner than the full retry delay.
		// (When a majority refused, someone holds it: that is contention.)
		// Not for a multi-lock: its splits are between overlapping sets,
		// and a short pause for all of them makes them meet again; the
		// jittered retry delay spreads them (multilock.go).
		d = splitPause()
	}
	if q.timer == nil {
		q.timer = time.NewTimer(d)
	} else {
		q.timer.Reset(d)
	}
	due := time.Now().Add(d)
	var woken <-chan struct{}
	if q.w != nil {
		woken = q.w.c
	}
	for {
		select {
		case <-q.timer.C:
			return nil
		case <-woken:
			if queuesFor(q.cfg.mode) {
				// A read-write release says it may be our turn: nothing
				// was handed to us, so attempt now (rwlock.go).
				return nil
			}
			// Releases handed us the key: on a majority of nodes, it is
			// ours (step 9); on fewer, wait for the rest, unless only an
			// attempt can tell.
			switch verdict, until := q.handedTo(l); verdict {
			case handedMajority:
				q.handedUntil = until
				return nil
			case handedConfirm:
				return nil
			case handedFew:
				// The other releases land within a node timeout, or went
				// elsewhere (heads that differ between nodes): then an
				// attempt settles it, without waiting out the whole retry
				// delay.
				if wait := q.cfg.nodeTimeout; time.Until(due) > wait {
					q.timer.Reset(wait)
					due = time.Now().Add(wait)
				}
			}
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-c.closing:
			return ErrClosed
		}
	}
}

// What a wake-up tells a waiting Lock call (handedTo).
const (
	handedNone     = iota // no node handed our current token the key (a signal for an earlier token): wait on
	handedFew             // fewer than a majority of nodes handed us the key yet: wait on
	handedMajority        // a majority did: the lock is ours, no round needed
	handedConfirm         // some did, but only an attempt can tell: make one now
)

// handedTo says what the releases that handed l's token the key add up to,
// and, for a majority, until when the lock may be trusted (handoffValidity). A
// confirming attempt (which re-arms a key that holds our token to the
// TTL) is needed instead with fencing (its counters come with an attempt),
// for a fixed lease (no renewal would extend the reservations), once the
// token yielded a node (a message from before the yield may name a node
// no longer ours), or when too little validity is left for the first
// renewal (handoffMin): a waiter frozen past its reservation, say.
func (q *waiting) handedTo(l *Lock) (int, time.Time) {
	c := q.c
	att := q.w.handedAttempts(l.token)
	n := 0
	for _, a := range att {
		if a >= 0 {
			n++
		}
	}
	switch {
	case n == 0:
		return handedNone, time.Time{}
	case l.cfg.fencing || !l.cfg.autoRenew || q.yielded || q.queuedAt.IsZero():
		return handedConfirm, time.Time{}
	case n < c.quorum:
		return handedFew, time.Time{}
	}
	until := q.handoffValidity(l, att)
	if time.Until(until) < l.cfg.handoffMin() {
		return handedConfirm, time.Time{}
	}
	return handedMajority, until
}

// handoffValidity is the validity that the handoffs att (per node, the attempt
// a message named; -1 none) give l's token: the q-th latest of their
// nodes' deadlines. Node i set the key, for the reservation on its own
// clock, after the request of the attempt its message names was sent (the
// entry it served was queued or last refreshed by that request: a release
// names the attempt recorded with the entry), so it holds our token at
// least until that attempt's start plus the reservation, less the drift
// allowance (step 3) — however late the message arrived, since an entry
// queued again after a lapse carries a later attempt. An attempt not
// recorded any more counts from the first attempt that queued the token,
// which every entry of the token followed.
func (q *waiting) handoffValidity(l *Lock, att []int64) time.Time {
	var ds []time.Time
	for _, a := range att {
		if a >= 0 {
			ds = append(ds, quorum.Deadline(q.startOf(a), l.cfg.reservation(), l.cfg.drift))
		}
	}
	slices.SortFunc(ds, func(a, b time.Time) int { return b.Compare(a) })
	return ds[q.c.quorum-1]
}

// noteStart records when attempt n began (see handoffValidity).
func (q *waiting) noteStart(n int64, at time.Time) {
	if n > 0 {
		q.starts[n%int64(len(q.starts))] = attemptStart{n: n, at: at}
	}
}

// startOf is when attempt n of the current token began, or, when that is
// no longer recorded, when the first attempt that queued the token did: a
// lower bound either way.
func (q *waiting) startOf(n int64) time.Time {
	if n > 0 {
		if s := q.starts[n%int64(len(q.starts))]; s.n == n {
			return s.at
		}
	}
	return q.queuedAt
}

// queueLife is how long a waiter's queue entry lasts on a node after its
// latest attempt there (DESIGN step 9: each entry lapses on its own): a
// waiting Lock call attempts again at least every retry delay plus three
// node timeouts (the rest of a round, the settling of a split, the next
// request's way there), so twice the longest retry delay and four node
// timeouts keep a live waiter's entry,
// and a waiter that went away (frozen, partitioned, crashed) drops out by
// itself that long after its last attempt. One that finds its entry gone
// joins again, with its ticket, so its place in the order is kept.
func (c *config) queueLife() time.Duration {
	return 2*c.retryMax + 4*c.nodeTimeout
}

// reservation is how long a release that hands the key to a waiter sets
// it for (DESIGN step 9): long enough for the waiter to learn of it and
// renew it to its TTL (a node timeout, and a retry delay for a waiter whose
// last attempt was that long before the handoff), far below the TTL: two
// node timeouts, or two retry delays and a node timeout when that is more,
// at most half the TTL. A frozen, partitioned or dead grantee so holds up
// the next waiter by one reservation at most: 2s at the default options.
func (c *config) reservation() time.Duration {
	return min(max(2*c.nodeTimeout, 2*c.retryMax+c.nodeTimeout), c.ttl/2)
}

// handoffMin is the least validity a lock handed over by a majority of
// releases may have left for Lock to return it without a confirming round:
// time for its first renewal, due halfway to the last node timeout (see
// firstRenewal), to land: one and a half node timeouts.
func (c *config) handoffMin() time.Duration {
	return c.nodeTimeout + c.nodeTimeout/2
}
