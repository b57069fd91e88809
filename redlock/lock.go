package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/renew"
)

type state int8

const (
	stateHeld     state = iota
	stateLost           // lost: Lost() closed, Context cancelled with ErrLockLost
	stateUnlocked       // Unlock was called
	stateClosed         // the Client was closed
	stateFinished       // a failed attempt; never handed out
)

// closedChan is what Lost returns for a nil *Lock.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Lock is a lock held on a majority of nodes. It is safe for concurrent use.
// Methods on a nil *Lock are safe: Unlock and Extend return ErrNotHeld, Valid
// is false, Lost returns a closed channel, Context returns a cancelled
// context.
//
// Values of this type must not be copied.
type Lock struct {
	c        *Client
	resource string
	keys     []scripts.Keys // per node
	token    string
	fence    int64     // write-once before the Lock is handed out
	acquired time.Time // write-once before the Lock is handed out
	id       uint64    // write-once: the lock's ID for hooks
	cfg      config
	lost     chan struct{}           // closed once, on loss
	lostDone chan struct{}           // closed once lose has run its hooks
	ctx      context.Context         // write-once before the Lock is handed out
	cancel   context.CancelCauseFunc // write-once, with ctx

	mu         sync.Mutex // protects the fields below
	state      state
	validUntil time.Time
	lostErr    error
	handle     *renew.Handle
	rounds     []inflight // rounds of this lock with requests maybe still in flight
	unsure     []bool     // per node (nil: none): a request there went unanswered
	// waiter is how the Lock call queues on the nodes (step 9); its zero
	// value does not queue. Set by the call's goroutine between attempts.
	waiter scripts.Waiter
}

// Resource returns the name of the locked resource.
func (l *Lock) Resource() string {
	if l == nil {
		return ""
	}
	return l.resource
}

// Token returns the value stored under the lock key on the nodes: 122 random
// bits (a uuid v4), unique per acquisition and unguessable. It is what proves
// ownership to the scripts; do not log it.
func (l *Lock) Token() string {
	if l == nil {
		return ""
	}
	return l.token
}

// Fence returns the fencing token of this acquisition: it strictly increases
// across successive holders of the resource. It is 0 unless the lock was
// acquired with WithFencing(true).
func (l *Lock) Fence() int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// ValidUntil returns the local deadline until which the lock may be trusted,
// from the last successful acquire or extend: the start of that round plus
// the TTL minus the drift allowance. It is read on the monotonic clock.
func (l *Lock) ValidUntil() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Valid reports whether the lock is held: not lost, not unlocked, not closed,
// and now is before ValidUntil. It never reports true at or after
// ValidUntil. It does no I/O.
func (l *Lock) Valid() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == stateHeld && time.Now().Before(l.validUntil)
}

// Lost returns a channel that is closed when the lock is lost: a majority of
// nodes said the key is no longer ours, or ValidUntil passed without a
// successful renewal. Unlock and Close do not close it, except to report a
// loss that has already happened: a lock whose ValidUntil passed before
// Unlock or Close ran is reported lost first.
func (l *Lock) Lost() <-chan struct{} {
	if l == nil {
		return closedChan
	}
	return l.lost
}

// Context returns a context that lives as long as the lock: it is cancelled
// on loss (context.Cause matches ErrLockLost), on Unlock (cause ErrUnlocked)
// and on Close (cause ErrClosed). It carries the values of the ctx given to
// Lock, but not its cancellation.
func (l *Lock) Context() context.Context {
	if l == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrNotHeld)
		return ctx
	}
	return l.ctx
}

// Extend re-arms the lease (the TTL) on a majority of nodes now, and moves
// ValidUntil. Where a node has lost the key (it restarted empty), the key is
// set again with our token; a node where another token holds it counts
// against us. New validity is measured from before the first request.
//
// Extend never resurrects an expired lock: after loss, or at or after
// ValidUntil, it returns an error matching ErrLockLost without I/O. When a
// majority says the key is not ours, the lock is lost and the error matches
// both ErrLockLost and ErrNotHeld. When too few nodes answer while validity
// remains, it returns ErrNoQuorum joined with the node errors, and the lock
// is not yet lost. After Unlock it returns ErrNotHeld; after Close,
// ErrClosed.
func (l *Lock) Extend(ctx context.Context) error {
	if l == nil {
		return ErrNotHeld
	}
	return l.extend(ctx, time.Time{})
}

// extend runs one extension round; due is set for a renewal (when it was
// due), zero for an Extend call.
func (l *Lock) extend(ctx context.Context, due time.Time) error {
	if err := l.usable(); err != nil {
		return err
	}
	c := l.c
	if err := c.begin(); err != nil {
		return err
	}
	defer c.end()
	// Step 5: re-arm where ours, set where absent, on every node.
	r := quorum.Start(ctx, len(c.nodes), l.cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, site{l.cfg.obs, "extend", l.resource}, func(ctx context.Context, s redis.Scripter) (reply, error) {
			e, err := scripts.Extend(ctx, s, l.keys[i], l.token, l.cfg.ttl, l.fence)
			return reply{ours: e != scripts.Refused, healed: e == scripts.Healed}, err
		})
	})
	l.track(roundRef{r})
	t := r.Collect(ctx, classify, quorum.Majority)
	healed := 0
	for i, v := range t.Votes {
		if rep, ok := r.Reply(i); ok && v == quorum.Yes && rep.Val.healed {
			healed++
		}
	}
	return l.settle(ctx, r.Started(), t, healed, due)
}

// settle applies the tally of an extension round that started at started:
// new validity on a majority, loss when a majority says not ours, and
// ErrNoQuorum otherwise (the lock is not lost yet). due is set for a
// renewal: when it was due.
func (l *Lock) settle(ctx context.Context, started time.Time, t quorum.Tally, healed int, due time.Time) (err error) {
	c := l.c
	n := len(c.nodes)
	if obs := l.cfg.obs; obs != nil {
		defer func() {
			info := ExtendInfo{Lock: l.id, Resource: l.resource, Renewal: !due.IsZero(), Latency: t.Elapsed,
				Confirmed: t.Yes, Healed: healed, Quorum: c.quorum, Nodes: n, Err: err, NodeErrors: c.nodeErrors(t)}
			if !due.IsZero() && err == nil {
				info.Lag = max(time.Since(due), 0)
			}
			obs.Extend(ctx, info)
		}()
	}
	switch {
	case t.Quorum():
		until := quorum.Deadline(started, l.cfg.ttl, l.cfg.drift)
		l.mu.Lock()
		if l.state != stateHeld {
			l.mu.Unlock()
			return l.usable()
		}
		// A renewal counts only if it was decided before the old deadline:
		// after it, another client may have held the lock in between.
		if !time.Now().Before(l.validUntil) {
			l.mu.Unlock()
			return l.expire(nil)
		}
		if until.After(l.validUntil) {
			l.validUntil = until
		}
		l.mu.Unlock()
		return nil
	case t.No >= c.quorum:
		err := c.joinNodeErrors(fmt.Errorf("%w: %w: %d of %d nodes hold another owner's key or none, %d confirmed",
			ErrLockLost, ErrNotHeld, t.No, n, t.Yes), t)
		l.lose(err)
		return err
	}
	tally := fmt.Sprintf("%d of %d nodes confirmed the extension, %d needed (%d failed, %d refused, %d not waited for)",
		t.Yes, n, c.quorum, t.Failed, t.No, n-t.Yes-t.No-t.Failed)
	// A round that ends at or after ValidUntil without a majority leaves
	// the lock lost, not "not yet lost": another client may hold it now.
	l.mu.Lock()
	st, expired := l.state, !time.Now().Before(l.validUntil)
	l.mu.Unlock()
	switch {
	case st != stateHeld:
		return l.usable() // lost meanwhile (at ValidUntil, say), unlocked or closed
	case expired:
		return l.expire(c.joinNodeErrors(errors.New(tally), t))
	}
	return c.joinNodeErrors(fmt.Errorf("%w: %s", ErrNoQuorum, tally), t)
}

// usable returns nil while the lock is held and valid, or the error Extend
// returns otherwise (reporting the loss if validity just ran out).
func (l *Lock) usable() error {
	l.mu.Lock()
	st, until, lostErr := l.state, l.validUntil, l.lostErr
	l.mu.Unlock()
	switch st {
	case stateLost:
		return lostErr
	case stateClosed:
		return ErrClosed
	case stateUnlocked, stateFinished:
		return ErrNotHeld
	}
	if !time.Now().Before(until) {
		return l.expire(nil)
	}
	return nil
}

// expire declares the lock lost because its validity ran out, and returns
// the loss error.
func (l *Lock) expire(last error) error {
	err := fmt.Errorf("%w: %w", ErrLockLost, errors.Join(renew.ErrExpired, last))
	l.lose(err)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		return l.lostErr
	}
	return err
}

// lose declares the lock lost, once: Lost() is closed, Context() cancelled
// with err, renewal stopped, OnLost started on a goroutine the Client owns.
// It never blocks, so the scheduler may call it.
func (l *Lock) lose(err error) {
	if !errors.Is(err, ErrLockLost) {
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return
	}
	l.state, l.lostErr = stateLost, err
	h := l.handle
	l.mu.Unlock()
	if obs := l.cfg.obs; obs != nil {
		obs.Lost(l.ctx, LostInfo{Lock: l.id, Resource: l.resource, HeldFor: time.Since(l.acquired), Err: err})
	}
	// Cancel before closing Lost, so that a reader woken by Lost already
	// sees the cause on Context.
	l.cancel(err)
	close(l.lost)
	if h != nil {
		h.Cancel()
	}
	if fn := l.cfg.onLost; fn != nil {
		l.c.goCallback(func() { fn(l, err) })
	}
	close(l.lostDone)
}

// reportExpiry declares the loss of a lock whose validity has run out
// although the deadline timer has not fired yet, so that every lock that
// expired before its release is reported lost exactly once, before the
// release.
func (l *Lock) reportExpiry() {
	l.mu.Lock()
	expired := l.state == stateHeld && !time.Now().Before(l.validUntil)
	l.mu.Unlock()
	if expired {
		_ = l.expire(nil)
	}
}

// goCallback runs fn on a goroutine the Client owns, unless the Client is
// closed.
func (c *Client) goCallback(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.wg.Go(fn)
}

// finish ends a held lock for a reason other than loss: cause is
// ErrUnlocked, ErrClosed, or ErrClosed for a lock never handed out.
func (l *Lock) finish(cause error) {
	l.mu.Lock()
	if l.state == stateHeld {
		switch cause {
		case ErrUnlocked:
			l.state = stateUnlocked
		case ErrClosed:
			l.state = stateClosed
		default:
			l.state = stateFinished
		}
	}
	l.mu.Unlock()
	if l.cancel != nil {
		l.cancel(cause)
	}
}

// Unlock stops the renewal (waiting for one in flight), cancels Context with
// cause ErrUnlocked, and runs check-and-delete on every node — also after
// the lock was lost, since the key may still be ours on some nodes. The
// release goes out even if ctx is already done (on a context without its
// cancellation), bounded by the node timeout.
//
// It returns nil when the key was ours on at least one node and a majority
// answered; ErrNotHeld when no node held our token (the lease expired, or
// the lock was already unlocked); ErrNoQuorum joined with the node errors
// when too few nodes answered (keys left there expire with their TTL);
// ErrClosed after Close.
func (l *Lock) Unlock(ctx context.Context) error {
	if l == nil {
		return ErrNotHeld
	}
	c := l.c
	if err := c.begin(); err != nil {
		return err
	}
	defer c.end()
	l.mu.Lock()
	h := l.handle
	l.mu.Unlock()
	if h != nil {
		h.Stop()
	}
	l.reportExpiry()
	l.finish(ErrUnlocked)
	c.mu.Lock()
	delete(c.locks, l)
	c.mu.Unlock()
	return l.release(ctx)
}

// release runs check-and-delete on every node (step 6) and waits for every
// answer, bounded by the node timeout; it reports to the hooks.
func (l *Lock) release(ctx context.Context) (err error) {
	c := l.c
	var t quorum.Tally
	if obs := l.cfg.obs; obs != nil {
		start := time.Now()
		l.mu.Lock()
		wasLost := l.state == stateLost
		l.mu.Unlock()
		defer func() {
			if wasLost {
				<-l.lostDone // the Lost hook comes first
			}
			obs.Release(ctx, ReleaseInfo{Lock: l.id, Resource: l.resource, Latency: time.Since(start), HeldFor: time.Since(l.acquired),
				WasLost: wasLost, Released: t.Yes, Err: err, NodeErrors: c.nodeErrors(t)})
		}()
	}
	t = l.releaseAll(ctx)
	return l.releaseError(t)
}

// releaseAll releases the lock on every node at once and waits for every
// answer (or the node timeout): returning after a majority would leave our
// key on the others for a moment, and an immediate Lock of the same
// resource could find it there. The requests go out even if ctx is done.
func (l *Lock) releaseAll(ctx context.Context) quorum.Tally {
	dctx := context.WithoutCancel(ctx)
	r := quorum.Start(dctx, len(l.c.nodes), l.cfg.timeout(), &l.c.wg, func(ctx context.Context, i int) (bool, error) {
		return l.releaseNode(ctx, i)
	})
	return r.Collect(dctx, voteReleased, quorum.All)
}

func voteReleased(_ int, rep quorum.Reply[bool]) (quorum.Vote, error) {
	switch {
	case rep.Err != nil:
		return quorum.Failed, rep.Err
	case rep.Val:
		return quorum.Yes, nil
	}
	return quorum.No, nil
}

// releaseError is what Unlock returns for the tally of a release.
func (l *Lock) releaseError(t quorum.Tally) error {
	c := l.c
	n := len(c.nodes)
	answered := t.Yes + t.No
	switch {
	case answered < c.quorum:
		return c.joinNodeErrors(fmt.Errorf("%w: %d of %d nodes answered the release, %d needed; keys left expire with their TTL", ErrNoQuorum, answered, n, c.quorum), t)
	case t.Yes == 0:
		return c.joinNodeErrors(ErrNotHeld, t)
	}
	return nil
}

// releaseNode releases the key on node i (steps 4, 6 and 9): hands it to
// the first waiter queued there or deletes it, takes our own queue entry
// out, and, when a request of this lock may still be in flight there,
// leaves the token's guard, so that the request sets nothing when it lands,
// whatever the key holds then. A release that got no answer is retried in
// the background.
func (l *Lock) releaseNode(ctx context.Context, i int) (bool, error) {
	ok, err := call(l.c, ctx, i, site{l.cfg.obs, "release", l.resource}, func(ctx context.Context, s redis.Scripter) (bool, error) {
		r, err := l.releaseScript(ctx, i, s, l.guardFor(i), false)
		return r == scripts.Deleted || r == scripts.HandedOver, err
	})
	if retryable(err) {
		rctx := context.WithoutCancel(ctx)
		l.c.goCallback(func() { l.retryRelease(rctx, i) })
	}
	return ok, err
}

// releaseScript runs the release script on node i; yield is for a waiter
// giving its minority of grants to older waiters.
func (l *Lock) releaseScript(ctx context.Context, i int, s redis.Scripter, guard time.Duration, yield bool) (scripts.Released, error) {
	return scripts.Release(ctx, s, l.keys[i], l.token, guard, l.waiter, yield, l.cfg.reservation(), l.c.channelPrefix())
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

// guardTTL is how long a release's guard stays: twice the TTL. A request
// of ours delayed on the way to a node, or queued on a paused node, cannot
// set our key again after our release for that long. Only a request held
// up for longer still (a node paused for over two TTLs while holding it)
// could set the key again, for one TTL at most. The guard is a key of its
// own, so it keeps nobody else waiting.
func (l *Lock) guardTTL() time.Duration {
	if testhooks.SkipReleaseGuard.Load() {
		return 0 // a negative control of the chaos checker
	}
	return 2 * l.cfg.ttl
}

// inflight is a round of requests of this lock, seen by release: where a
// node has not answered it, a request may still land after the release.
type inflight interface {
	answered(i int) bool // node i's reply is in (not a timeout or a connection error)
	settled() bool       // every node has answered or given up
}

// answered reports whether rep is a reply of the node itself: a result, or
// an error reply. A timeout or a connection error leaves it unknown whether
// (and when) the request reaches the node.
func answered(err error) bool {
	var re redis.Error
	return err == nil || errors.As(err, &re)
}

// roundRef is a round of this lock alone.
type roundRef struct{ r *quorum.Round[reply] }

func (p roundRef) answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && answered(rep.Err)
}
func (p roundRef) settled() bool { return p.r.Settled() }

// retryable reports whether a release failed for want of an answer (a
// timeout, a connection error), not because the node refused it.
func retryable(err error) bool {
	return err != nil && !answered(err) && !errors.Is(err, errBusy)
}

// retryRelease sends the release (with its guard) to node i again, with
// backoff, until the node answers, the lock's TTL has passed (our key, if
// any, is gone by then), or the Client closes. A node that was paused or
// unreachable during Unlock may still hold our key — or get it from a
// request of ours it runs when it resumes.
func (l *Lock) retryRelease(ctx context.Context, i int) {
	deadline := time.Now().Add(l.cfg.ttl)
	delay := max(l.cfg.timeout(), 10*time.Millisecond)
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-l.c.closing:
			return
		}
		rctx, cancel := context.WithTimeout(ctx, l.cfg.timeout())
		_, err := call(l.c, rctx, i, site{l.cfg.obs, "release", l.resource}, func(ctx context.Context, s redis.Scripter) (scripts.Released, error) {
			return l.releaseScript(ctx, i, s, l.guardTTL(), false)
		})
		cancel()
		if !retryable(err) || time.Now().Add(delay).After(deadline) {
			return
		}
		delay = min(2*delay, time.Second)
		t.Reset(delay)
	}
}

// track remembers a round until all its requests have answered or given
// up; a node that gave up on one is remembered in unsure for good (its
// request may land at any later time).
func (l *Lock) track(r inflight) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := l.rounds[:0]
	for _, old := range l.rounds {
		if !old.settled() {
			keep = append(keep, old)
			continue
		}
		for i := range l.keys {
			if !old.answered(i) {
				if l.unsure == nil {
					l.unsure = make([]bool, len(l.keys))
				}
				l.unsure[i] = true
			}
		}
	}
	clear(l.rounds[len(keep):])
	l.rounds = append(keep, r)
}

// watch is what the renewal scheduler sees of a Lock.
type watch struct{ l *Lock }

var _ renew.Target = watch{}

func (w watch) Renew(ctx context.Context, due time.Time) error {
	return renewError(w.l.extend(ctx, due))
}

// renewError marks the errors that end a lock's renewal for good.
func renewError(err error) error {
	if err != nil && (errors.Is(err, ErrLockLost) || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrClosed)) {
		return backoff.Permanent(err)
	}
	return err
}

func (w watch) ValidUntil() time.Time { return w.l.ValidUntil() }

func (w watch) Lose(err error) {
	// A renewal that raced Close (it found the Client closed) is not a
	// loss: Close ends the lock with cause ErrClosed.
	if errors.Is(err, ErrClosed) {
		return
	}
	if errors.Is(err, renew.ErrExpired) && !errors.Is(err, ErrLockLost) {
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	w.l.lose(err)
}
