package redlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/renew"
)

var _ renew.Batcher = batcher{}

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
// is not yet lost. When ctx is cancelled before any node answered, it
// returns an error matching context.Canceled (not ErrNoQuorum), and the
// lock is as it was; a ctx already done (cancelled or past its deadline)
// when Extend is called sends nothing, and the error matches ctx's alone. After Unlock it returns ErrNotHeld; after Close,
// ErrClosed.
func (l *Lock) Extend(ctx context.Context) error {
	if l == nil || l.current() != l { // nil, or passed on to another goroutine (cohort.go)
		return ErrNotHeld
	}
	if ctx.Err() != nil {
		// Nothing sent (issue 44 item 3); a lock that can no longer be
		// extended says so first.
		if err := l.usable(); err != nil {
			return err
		}
		return ctxDoneBefore(ctx)
	}
	return l.extend(ctx, time.Time{})
}

// extend runs one extension round; due is set for a renewal (when it was
// due), zero for an Extend call.
func (l *Lock) extend(ctx context.Context, due time.Time) error {
	c := l.c
	if err := c.begin(); err != nil {
		return err
	}
	defer c.wg.Done()
	// Registered before anything is sent, with its start (so its deadline)
	// fixed, in the same step as the check that the lock is held
	// (node.Op.Held): an Unlock either finds the round pending (and guards
	// the nodes against it, for as long as it can land) or is seen here,
	// and nothing is sent.
	r, err := l.startExtend(ctx, true, l.extendCalls())
	if err != nil {
		return err
	}
	t := r.Collect(ctx, classify, quorum.Majority)
	healed := 0
	for i, v := range t.Votes {
		if rep, ok := r.Reply(i); ok && v == quorum.Yes && rep.Val.healed {
			healed++
		}
	}
	return l.settle(ctx, r.Started(), t, healed, due)
}

// startExtend sends ext, the extension script's calls (one per node; step
// 5: re-arm where ours, set where absent; Resume's re-arm without heal,
// handover.go) to every node at once, and returns the round; with held,
// only while the lock is held.
func (l *Lock) startExtend(ctx context.Context, held bool, ext []scripts.Prepared) (*quorum.Round[reply], error) {
	return node.Run(ctx, l.tok, node.Op{Name: "extend", Held: held, Bound: true, Owner: (*owner)(l)}, func(ctx context.Context, i int, s redis.Scripter, notAfter *int64) (reply, error) {
		e, err := ext[i].Extend(ctx, s, notAfter)
		return reply{ours: e != scripts.Refused, healed: e == scripts.Healed}, err
	})
}

// extendCalls returns the extend script's call per node, built at the
// lock's first extension: its keys and arguments (token, TTL, fence) stay
// the same for the lock's life, and plain nodes share one call.
func (l *Lock) extendCalls() []scripts.Prepared {
	l.extOnce.Do(func() {
		l.ext = make([]scripts.Prepared, len(l.keys))
		for i, k := range l.keys {
			if i > 0 && k.Lock == l.keys[i-1].Lock {
				l.ext[i] = l.ext[i-1]
				continue
			}
			l.ext[i] = scripts.PrepareExtend(k, l.token, l.cfg.ttl, l.fence)
		}
	})
	return l.ext
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
				Confirmed: t.Yes, Pending: t.Pending, Healed: healed, Quorum: c.quorum, Nodes: n, Err: err, NodeErrors: c.nodeErrors(t)}
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
		passed := l.cur != l
		l.mu.Unlock()
		if passed && due.IsZero() {
			// An Extend of a handle whose lease was passed on while the
			// round was out (cohort.go): it renewed the lease, but this
			// handle's Unlock has returned. (A renewal reports for the
			// lease: nil.)
			return ErrNotHeld
		}
		return nil
	case t.No >= c.quorum:
		err := c.joinNodeErrors(&classed{msg: fmt.Sprintf("redlock: lock lost: our key is gone from %d of %d nodes "+
			"(another owner's key there, or no key: it expired or was deleted), %d confirmed", t.No, n, t.Yes),
			class: []error{ErrLockLost, ErrNotHeld}}, t)
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
	case cancelled(t):
		// The caller's own cancellation, not an outage (issue 21 item 7):
		// the lock is as it was, and the adapters count no failure.
		return c.joinNodeErrors(ctxCancelled(tally), t)
	}
	return c.joinNodeErrors(fmt.Errorf("%w: %s", ErrNoQuorum, tally), t)
}
