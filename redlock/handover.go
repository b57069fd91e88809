package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/quorumlock/quorumlock/quorum"
)

// ErrDetached is the cause of a Lock's Context after Detach: the lock was
// handed over, not released.
var ErrDetached = errors.New("redlock: detached (handed over)")

// Detach hands the lock over without releasing it: renewal stops, the
// Client forgets the lock (Close will not release it), Context is cancelled
// with cause ErrDetached, and Lost is not closed. The keys stay on the nodes
// until their TTL runs out, unless another process takes the lock over with
// Resume(resource, token) and renews it. After Detach, Unlock and Extend
// return ErrNotHeld without I/O, and Valid is false. Give the other process
// Resource and Token (the token is a secret: pass it as one, never log it).
//
// Detach returns ErrNotHeld when the lock is not held (unlocked, lost,
// detached, or nil), ErrClosed after Close. It does no I/O.
func (l *Lock) Detach() error {
	if l == nil {
		return ErrNotHeld
	}
	c := l.c
	if err := c.begin(); err != nil {
		return err
	}
	defer c.end()
	l.mu.Lock()
	held := l.state == stateHeld
	h := l.handle
	l.mu.Unlock()
	if !held {
		return ErrNotHeld
	}
	if h != nil {
		h.Stop()
	}
	l.detached.Store(true)
	l.finish(ErrDetached)
	c.mu.Lock()
	c.forget(l)
	c.mu.Unlock()
	return nil
}

// Resume takes over the lock on resource whose token is token, held by
// another process or Client (a scheduler acquires, Detaches and hands the
// lock to a worker, which resumes, renews and releases it, as aioredlock's
// get_lock and redis-semaphore's acquiredExternally do). It runs one round
// of the extension script on every node: where the key holds token its TTL
// is re-armed; a node that lost the key gets it again only when a majority
// still held it. The returned *Lock is then renewed, reported lost,
// Extended and Unlocked by this Client as if it had acquired it, with the
// per-call options opts (WithTTL sets the lease it renews to; WithMaxHold
// counts from the resume). Its Fence is 0: fencing tokens are not carried
// over, pass the holder's Fence along with the token.
//
// Resume does not stop the previous holder: it must Detach the lock (or
// stop using and renewing it) first, or both would act on one lock.
//
// ctx bounds the call. It returns an error matching ErrNotHeld when the
// nodes that answered show that no majority holds token for resource (the
// lock expired, was released, or the token is wrong), after releasing the
// token on every node (in the background); ErrNoQuorum with the node
// errors when too few nodes answered to tell (the keys that held the token
// are left alone then, so Resume may be retried); ErrInvalidArgument for an empty resource, a token that
// is not one this library makes (a UUID), bad options, or a token this
// Client already holds; ErrClosed after Close.
func (c *Client) Resume(ctx context.Context, resource, token string, opts ...Option) (*Lock, error) {
	cfg, err := c.callConfig(resource, opts)
	if err != nil {
		return nil, err
	}
	if _, err := uuid.Parse(token); err != nil || strings.ContainsAny(token, "{}") {
		return nil, invalid("Resume: token is not a lock token of this library (Lock.Token)")
	}
	cfg.fencing = false // the counter is not ours to raise: Fence is 0
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.end()
	c.noteTimeout(cfg.timeout())
	if c.holdsToken(token) {
		return nil, invalid("Resume: this Client holds that lock already")
	}
	l := c.newLockToken(resource, cfg, token)
	r := l.startExtend(ctx) // extend.go
	l.track(roundRef{r})
	// Only a node where the key still held the token counts: a node that
	// was healed only says the key was absent there.
	held := func(i int, rep quorum.Reply[reply]) (quorum.Vote, error) {
		switch {
		case rep.Err != nil:
			return quorum.Failed, rep.Err
		case rep.Val.ours && !rep.Val.healed:
			return quorum.Yes, nil
		}
		return quorum.No, nil
	}
	t := r.Collect(ctx, held, quorum.Majority)
	deadline := quorum.Deadline(r.Started(), cfg.ttl, cfg.drift)
	if t.Quorum() && quorum.Validity(cfg.ttl, t.Elapsed, cfg.drift) > 0 {
		if err := c.hold(ctx, l, deadline, 0); err != nil {
			c.abandon(ctx, l, quorum.Tally{})
			return nil, err
		}
		if l.handOut() {
			return l, nil
		}
		c.drop(ctx, l)
		return nil, fmt.Errorf("%w: Resume(%q): its validity ran out before Resume could return it", ErrNotHeld, resource)
	}
	n := len(c.nodes)
	if t.No > n-c.quorum || t.Quorum() {
		// No majority holds the token: the lock is gone. Release it
		// everywhere (step 4), the keys the round healed with the rest.
		c.abandon(ctx, l, quorum.Tally{})
	} else {
		// Undecided (too few answers): take back only what the round set
		// where it answered (nodes it healed), and leave the rest alone,
		// so that a Resume retried once the nodes answer finds the keys
		// that held the token. A request that got no answer may still
		// heal its node; its not-after bound (step 4) limits when, and the
		// key lives one TTL at most: this is the one exception to step
		// 4's release of every node, since that release would delete a
		// live handed-over lock.
		l.mu.Lock()
		l.state = stateFinished
		l.mu.Unlock()
		dctx := context.WithoutCancel(ctx)
		args := l.releaseArgs()
		for i := range n {
			if rep, ok := r.Reply(i); ok && rep.Err == nil && rep.Val.healed {
				c.wg.Go(func() {
					rctx, cancel := context.WithTimeout(dctx, cfg.timeout())
					defer cancel()
					_, _ = l.releaseNode(rctx, i, args)
				})
			}
		}
	}
	switch {
	case t.No > n-c.quorum || t.Quorum():
		return nil, c.joinNodeErrors(fmt.Errorf("%w: Resume(%q): %d of %d nodes hold the token, %d needed", ErrNotHeld, resource, t.Yes, n, c.quorum), t)
	case cancelled(t):
		return nil, c.joinNodeErrors(errors.Join(ctxCancelled(fmt.Sprintf("%d of %d nodes answered", t.Yes+t.No, n)), ctx.Err()), t)
	}
	return nil, c.joinNodeErrors(fmt.Errorf("%w: Resume(%q): %d of %d nodes hold the token, %d refused, %d failed; %d needed", ErrNoQuorum, resource, t.Yes, n, t.No, t.Failed, c.quorum), t)
}

// holdsToken reports whether this Client holds a lock with token.
func (c *Client) holdsToken(token string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for l := range c.locks {
		if l.token == token {
			return true
		}
	}
	return false
}

// Held returns the locks this Client holds now — returned by Lock,
// TryLock, a Semaphore or Resume, and not unlocked, lost, detached or
// closed since — sorted by resource, then by acquisition. It does no I/O;
// a lock may be lost the moment after. After Close it returns nil.
func (c *Client) Held() []*Lock {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	ls := make([]*Lock, 0, len(c.locks))
	for l := range c.locks {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	out := ls[:0]
	for _, l := range ls {
		l.mu.Lock()
		ok := l.returned && l.state == stateHeld && time.Now().Before(l.validUntil)
		l.mu.Unlock()
		if ok {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b *Lock) int {
		if c := strings.Compare(a.resource, b.resource); c != 0 {
			return c
		}
		return a.acquired.Compare(b.acquired)
	})
	return out
}
