package election

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/redlock"
)

// closedChan is what Lost returns for a nil *Term.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Term is one term of office of a candidate, from a Campaign that won to a
// Resign or a loss. It is safe for concurrent use. Methods on a nil *Term
// are safe: Resign returns ErrNotLeader, Lost returns a closed channel,
// Context a cancelled context.
type Term struct {
	e     *Election
	lock  *redlock.Lock
	me    Leader // write-once
	value string // write-once: the identity value on the nodes
	// written is the lease's ValidUntil as of the last identity write that
	// a majority took: the identity lasts at least until then. Only watch
	// uses it after newTerm.
	written time.Time

	stopRefresh chan struct{} // closed by Resign: stop writing the identity
	refreshed   chan struct{} // closed by watch once it no longer writes it
	done        chan struct{} // closed when watch has returned

	resignOnce sync.Once
	resignErr  error // set once by resignOnce

	// unlost is nil but under the negative control
	// testhooks.TermIgnoresLoss (see ignoreLoss).
	unlost context.Context
}

func newTerm(e *Election, l *redlock.Lock, me Leader, value string, written time.Time) *Term {
	t := &Term{e: e, lock: l, me: me, value: value, written: written,
		stopRefresh: make(chan struct{}), refreshed: make(chan struct{}), done: make(chan struct{})}
	if testhooks.TermIgnoresLoss.Load() {
		t.unlost = ignoreLoss(l.Context())
	}
	return t
}

// ignoreLoss is the negative control testhooks.TermIgnoresLoss: a context
// that ends when lctx does, except when lctx ends by a loss of the lease.
func ignoreLoss(lctx context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(lctx))
	context.AfterFunc(lctx, func() {
		if cause := context.Cause(lctx); !errors.Is(cause, redlock.ErrLockLost) {
			cancel(cause)
		}
	})
	return ctx
}

// Leader returns this term as Leader reports it.
func (t *Term) Leader() Leader {
	if t == nil {
		return Leader{}
	}
	return t.me
}

// Fence returns the term's fencing token: it strictly increases across
// successive terms of an election whose lock uses redlock.WithFencing (see
// WithLockOptions), and is 0 without. Attach it to the leader's writes, so
// that a store can refuse those of a deposed leader (see redlock.FencedSet).
func (t *Term) Fence() int64 {
	if t == nil {
		return 0
	}
	return t.me.Fence
}

// ValidUntil returns the local deadline of the lease, as of its last
// renewal: redlock.Lock.ValidUntil.
func (t *Term) ValidUntil() time.Time {
	if t == nil {
		return time.Time{}
	}
	if t.unlost != nil && t.unlost.Err() == nil {
		return time.Now().Add(time.Hour) // the negative control: the lease forgotten
	}
	return t.lock.ValidUntil()
}

// Context returns a context cancelled when the term ends: with cause
// redlock.ErrLockLost when the lease is lost, redlock.ErrUnlocked after
// Resign, redlock.ErrClosed when the redlock Client is closed. Run the
// leader's work with it.
func (t *Term) Context() context.Context {
	if t == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrNotLeader)
		return ctx
	}
	if t.unlost != nil {
		return t.unlost
	}
	return t.lock.Context()
}

// Lost returns a channel closed when the lease is lost (never by Resign).
func (t *Term) Lost() <-chan struct{} {
	if t == nil {
		return closedChan
	}
	return t.lock.Lost()
}

// Resign ends the term: the identity is withdrawn from the nodes, the lock
// is released — which wakes a candidate waiting in Campaign, so it takes
// office within a round trip or two, not a poll — and the change is
// announced to observers. The withdrawal and the announcement are decided
// at a majority, so a node that is slow or down delays them by nothing; the
// release is redlock.Lock.Unlock, which waits for every node's answer, at
// most its node timeout. ctx bounds the release. It waits for the term's
// goroutine to return. Calling it again returns the first call's result.
//
// It returns nil once resigned, an error matching ErrNotLeader (joined with
// the cause) when the term had already ended by loss or Close, and the
// errors of redlock.Lock.Unlock otherwise.
func (t *Term) Resign(ctx context.Context) error {
	if t == nil {
		return ErrNotLeader
	}
	t.resignOnce.Do(func() { t.resignErr = t.resign(ctx) })
	return t.resignErr
}

func (t *Term) resign(ctx context.Context) error {
	close(t.stopRefresh)
	<-t.refreshed
	if t.lock.Context().Err() != nil {
		<-t.done
		return errors.Join(ErrNotLeader, context.Cause(t.lock.Context()))
	}
	// Withdraw first, so that no observer sees this candidate as leader
	// after its successor took office. The refresh's writes still in
	// flight are made harmless by withdraw itself (see there).
	t.e.withdraw(ctx, t.value, t.me.Term)
	err := t.lock.Unlock(ctx)
	<-t.done
	if cause := context.Cause(t.lock.Context()); !errors.Is(cause, redlock.ErrUnlocked) {
		// Lost (or closed) before the Unlock took effect.
		return errors.Join(ErrNotLeader, cause)
	}
	return err
}

// watch keeps the identity's TTL in step with the lease until the term ends,
// then reports how it ended. It is the term's only goroutine; it returns
// when the lock's Context is done (Resign, loss, Close).
func (t *Term) watch() {
	defer close(t.done)
	lctx := t.lock.Context()
	// The identity's TTL is copied from the lock key's at each write, so it
	// lasts until the lease's validity as of that write. A renewal moves
	// the validity on; the identity must be written again after it and
	// before the validity it had ends. That window is at least the lock's
	// node timeout minus a renewal's round trip (redlock refuses a renew
	// interval that leaves less), so the term looks at the lease's
	// validity every quarter of the lock's node timeout (at most a
	// sixteenth of what is left of the lease, at least 1ms) and writes the
	// identity as soon as the validity has changed.
	every := func() time.Duration {
		return max(min(t.e.lockTimeout/4, time.Until(t.lock.ValidUntil())/16), time.Millisecond)
	}
	tick := time.NewTimer(every())
	defer tick.Stop()
	refreshing := true
	stopRefresh := t.stopRefresh
	defer func() {
		if refreshing {
			close(t.refreshed)
		}
	}()
	for {
		select {
		case <-lctx.Done():
			if refreshing {
				refreshing = false
				close(t.refreshed)
			}
			t.finish(lctx)
			return
		case <-stopRefresh:
			refreshing, stopRefresh = false, nil
			tick.Stop()
			close(t.refreshed)
		case <-tick.C:
			if !refreshing {
				continue
			}
			vu := t.lock.ValidUntil()
			tick.Reset(every())
			if vu.Equal(t.written) {
				continue
			}
			// Waits until the term ends at the latest; the writes go on
			// to the node timeout (see start).
			ok, errs := t.e.proclaim(lctx, t.lock.Token(), t.value, t.me.Term)
			switch {
			case ok >= t.e.quorum:
				t.written = vu
			case lctx.Err() == nil:
				// Tried again at the next tick.
				t.e.warn(lctx, "identity refreshed on too few nodes", noQuorum("identity refresh", errs))
			}
		}
	}
}

// finish reports the end of the term and cleans up after a loss.
func (t *Term) finish(lctx context.Context) {
	cause := context.Cause(lctx)
	ctx := context.Background()
	info := LeadershipInfo{Election: t.e.name, Identity: t.me.Identity, Fence: t.me.Fence, Held: time.Since(t.me.Since)}
	switch {
	case errors.Is(cause, redlock.ErrUnlocked):
		info.Event = EventResigned
	case errors.Is(cause, redlock.ErrClosed):
		info.Event, info.Err = EventResigned, cause
		t.e.withdraw(ctx, t.value, t.me.Term)
	default:
		info.Event, info.Err = EventLost, cause
		// The identity expires with the lease anyway; withdrawing it
		// (only where it is still ours) lets observers see the loss now.
		t.e.withdraw(ctx, t.value, t.me.Term)
		// Release what is left on the nodes (a minority may still hold
		// our key), bounded by the lock's node timeout.
		_ = t.lock.Unlock(ctx)
	}
	t.e.announce(ctx, "ended")
	t.e.report(ctx, info)
}
