package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Local handoff (lock cohorting, after Dice, Marathe and Shavit, PPoPP
// 2012: a cohort passes a lock locally a bounded number of times before it
// releases it globally).
//
// A Client's Lock calls on one resource wait in one line, in arrival
// order (a cohort); only one of them at a time contends on the nodes (the
// head), so that a Client queues on the nodes once, not once per
// goroutine. When a lock that a call of the line got is unlocked while
// another call waits in the line, Unlock passes the lease to it without a
// round trip: the waiter's Lock returns a new *Lock over the same lease
// (token, validity, renewal), and the old one is unlocked at once. While
// the Client holds the lease nobody of its line is queued on the nodes:
// the next call contends only once the lease went back through the nodes,
// so no queue entry of ours is left to be handed a key nobody wants.
//
// The bound: a lease is passed on at most WithLocalHandoff's count of
// times, and only within its time budget since it was taken on the nodes;
// then Unlock releases it on the nodes, where the waiters queued by other
// Clients are served first (in the nodes' order), and the next call of the
// line contends again. So a waiter of another Client queued on the nodes
// waits for this Client's lease at most the time budget plus the hold of
// the goroutine that holds it when the budget runs out, plus one release.
//
// Only plain exclusive locks are passed on: Lock or Do calls with no
// per-call option (both the holder's and the waiter's: the lease keeps the
// options it was taken with), without fencing (a fence grows per
// acquisition on the nodes; a lease passed on keeps its fence, so fencing
// turns local handoff off) and without WithMaxHold (the cap counts from
// the acquisition on the nodes). Read-write locks, multi-locks, semaphore
// permits, TryLock and Resume never are.

// cohort is this Client's Lock calls on one resource. lineMu guards it.
type cohort struct {
	line []*turn // calls waiting for their turn, in arrival order
	head bool    // a call of the line contends on the nodes (it left line)
	// held is the lease a call of the line got, while it may be passed on:
	// nobody of the line contends meanwhile.
	held *lease
}

// turn is one Lock call waiting in its Client's line.
type turn struct {
	ctx context.Context
	cfg config
	// ch gets the call's turn, once (buffered, sent under lineMu): a new
	// handle on the lease passed on, or nil to contend on the nodes.
	ch chan *Lock
}

// inLine is a Lock call of a kind that takes turns (all but readers): in
// this Client's line for resource, then either a lease passed on by
// Unlock, or, first in line with nothing held, the attempt loop (acquire).
func (c *Client) inLine(ctx context.Context, callID uint64, resource string, cfg config, attempts *int) (*Lock, error) {
	front := false
	for {
		t := c.join(ctx, resource, cfg, front)
		if t != nil {
			var l *Lock
			select {
			case l = <-t.ch:
			case <-ctx.Done():
				if c.leaveLine(resource, t) {
					return nil, errors.Join(fmt.Errorf("%w: earlier Lock calls of this client were ahead of it", ErrNotObtained), ctx.Err())
				}
				l = <-t.ch // served meanwhile
			case <-c.closing:
				if c.leaveLine(resource, t) {
					return nil, ErrClosed
				}
				l = <-t.ch
			}
			if l != nil {
				if l.handOut() {
					return l, nil
				}
				// Lost or expired between the handoff and here: give it
				// back through the nodes, and contend, first in line.
				select {
				case <-c.closing:
					return nil, ErrClosed
				default:
				}
				c.drop(ctx, l)
				c.cohortFree(l.lease)
				front = true
				continue
			}
			if ctx.Err() != nil { // our turn came as ctx ended: the next one's
				c.contended(resource, nil)
				return nil, errors.Join(fmt.Errorf("%w: its turn came as its ctx ended", ErrNotObtained), ctx.Err())
			}
		}
		l, err := c.acquire(ctx, callID, resource, cfg, attempts)
		c.contended(resource, l)
		return l, err
	}
}

// join puts a call in resource's line (at its front with front), and
// returns its turn; nil when the call is first with nothing held: it
// contends at once.
func (c *Client) join(ctx context.Context, resource string, cfg config, front bool) *turn {
	c.lineMu.Lock()
	defer c.lineMu.Unlock()
	co := c.cohorts[resource]
	if co == nil {
		co = &cohort{}
		c.cohorts[resource] = co
	}
	// First with nothing held, or, with a lease held that it may not take
	// (see passes), first to contend: it queues on the nodes as before.
	if !co.head && (co.held == nil && len(co.line) == 0 || co.held != nil && !cfg.passes()) {
		co.head = true
		return nil
	}
	t := &turn{ctx: ctx, cfg: cfg, ch: make(chan *Lock, 1)}
	if front {
		co.line = slices.Insert(co.line, 0, t)
	} else {
		co.line = append(co.line, t)
	}
	return t
}

// leaveLine takes t out of resource's line, and reports whether it was
// still there (else its turn was sent: t.ch has it).
func (c *Client) leaveLine(resource string, t *turn) bool {
	c.lineMu.Lock()
	defer c.lineMu.Unlock()
	co := c.cohorts[resource]
	if co == nil {
		return false
	}
	i := slices.Index(co.line, t)
	if i < 0 {
		return false
	}
	co.line = slices.Delete(co.line, i, i+1)
	return true
}

// contended ends the head's contention on resource: l (nil: none) is what
// it got. A lease that may be passed on stays with the line; otherwise the
// next call contends.
func (c *Client) contended(resource string, l *Lock) {
	c.lineMu.Lock()
	defer c.lineMu.Unlock()
	co := c.cohorts[resource]
	co.head = false
	if l != nil && l.cfg.passes() && l.holds() {
		co.held = l.lease
	}
	co.next(c, resource)
}

// cohortFree tells le's line that le is no longer held by a call of it
// (released on the nodes, lost, detached, closed): the next call
// contends.
func (c *Client) cohortFree(le *lease) {
	c.lineMu.Lock()
	defer c.lineMu.Unlock()
	if co := c.cohorts[le.resource]; co != nil && co.held == le {
		co.held = nil
		co.next(c, le.resource)
	}
}

// next gives the turn to contend, when nobody contends, to the first call
// in line, or, while a lease is held, to the first that may not take it
// (passes); it forgets the line once empty. lineMu is held.
func (co *cohort) next(c *Client, resource string) {
	if co.head {
		return
	}
	i := 0
	if co.held != nil {
		i = slices.IndexFunc(co.line, func(t *turn) bool { return !t.cfg.passes() })
	}
	if i < 0 {
		return
	}
	if len(co.line) == 0 {
		if co.held == nil {
			delete(c.cohorts, resource)
		}
		return
	}
	t := co.line[i]
	co.line = slices.Delete(co.line, i, i+1)
	co.head = true
	t.ch <- nil
}

// passes reports whether a lock of a call with this config may be passed
// on locally, or taken from another goroutine (see the top of this file).
// A call with WithRetryCount makes its attempts on the nodes.
func (cfg *config) passes() bool {
	return cfg.plain && cfg.mode == ModeMutex && !cfg.fencing && cfg.maxHold == 0 && cfg.localMax > 0 && cfg.retryCount == 0
}

// handOn passes l's lease to the first call waiting in its line, if any
// may take it within the budget (Unlock's first step): the waiter's Lock
// returns a new handle, and l is unlocked (its Context is cancelled with
// ErrUnlocked). It reports whether it did; then nothing was sent to the
// nodes.
func (c *Client) handOn(ctx context.Context, l *Lock) bool {
	if !l.cfg.passes() {
		return false
	}
	start := time.Now()
	c.lineMu.Lock()
	co := c.cohorts[l.resource]
	var t *turn
	i := -1
	if co != nil && co.held == l.lease {
		// The first call that may take it whose ctx has not ended (one
		// that ended leaves the line by itself).
		i = slices.IndexFunc(co.line, func(t *turn) bool { return t.ctx.Err() == nil && t.cfg.passes() })
	}
	if i >= 0 {
		t = co.line[i]
	}
	if t == nil || !t.cfg.passes() {
		c.lineMu.Unlock()
		return false
	}
	n := &Lock{lease: l.lease, id: c.ids.Add(1), lost: make(chan struct{}), lostDone: make(chan struct{})}
	n.ctx, n.cancel = context.WithCancelCause(context.WithoutCancel(t.ctx))
	n.outer, n.ctx = heldBy(t.ctx), context.WithValue(n.ctx, holderKey{}, n)
	c.mu.Lock()
	ok := !c.closed
	if ok {
		l.mu.Lock()
		ok = l.cur == l && l.state == stateHeld && time.Now().Before(l.validUntil) &&
			l.handoffs < l.cfg.localMax && time.Since(l.taken) < l.cfg.localFor
		if ok {
			l.cur, l.returned = n, false
			l.handoffs++
			n.acquired = time.Now()
		}
		l.mu.Unlock()
	}
	if ok {
		delete(c.locks, l)
		c.locks[n] = struct{}{}
	}
	c.mu.Unlock()
	if !ok {
		n.cancel(ErrUnlocked)
		c.lineMu.Unlock()
		return false
	}
	co.line = slices.Delete(co.line, i, i+1)
	// The old handle's Context ends before the new holder can run, as a
	// release ends it before anything is sent.
	l.cancel(ErrUnlocked)
	t.ch <- n
	c.lineMu.Unlock()
	if obs := l.cfg.obs; obs != nil {
		obs.Release(ctx, ReleaseInfo{Lock: l.id, Resource: l.resource, Latency: time.Since(start), HeldFor: time.Since(l.acquired), Local: true})
	}
	return true
}

// current returns the handle that holds l's lease now.
func (l *Lock) current() *Lock {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}
