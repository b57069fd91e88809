package redlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// Lock acquires the lock on resource, retrying with a jittered delay (see
// WithRetryDelay) until it is acquired, WithRetryCount attempts were made,
// ctx is done, or the Client is closed. ctx bounds the call, not the lease:
// the lock stays held (and renewed, unless WithAutoRenew(false)) until
// Unlock, loss or Close.
//
// It returns an error matching ErrNotObtained when another owner holds the
// lock, ErrNoQuorum (joined with one *NodeError per failed node) when too few
// nodes answered, joined with ctx's error when ctx ended;
// ErrAlreadyHeld at once when ctx comes from a lock of this Client still
// held on resource (its Context, or Do's fn ctx): the caller would wait for
// itself. Any other ctx is another caller's, which waits its turn, also
// when it is a goroutine of this Client's process.
// ErrInvalidArgument on bad input; ErrClosed after Close. A ctx done
// before the call (cancelled, or past its deadline) sends nothing: the
// error matches ctx's alone, neither ErrNotObtained nor ErrNoQuorum.
func (c *Client) Lock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, opts, false)
}

// TryLock makes exactly one attempt to acquire the lock on resource. It
// returns the same errors as Lock.
func (c *Client) TryLock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, opts, true)
}

// lock is one Lock call, or with once one TryLock call, on resource, for
// every kind of lock (rwlock.go, multilock.go): its options and resource
// checked, the call reported to the hooks when it returns (with the
// attempts it made), and Close waiting for it. It returns before sending
// anything on bad input (ErrInvalidArgument), when the caller holds the
// lock already (ErrAlreadyHeld), when the Client is closed (ErrClosed) and
// when ctx is done (ctx's error alone).
//
// TryLock is the straight path of an acquisition (DESIGN steps 1-3, and 8
// with fencing): one round (attempt), and what a failed one left on the
// nodes released in the background (abandonLate); it neither queues nor
// waits. Lock takes its turn in this Client's line for resource (but
// readers; inLine returns ErrClosed, or ErrNotObtained joined with ctx's
// error, while it waits there), then runs the retry loop, whose doc lists
// every other way a Lock call ends (acquire).
func (c *Client) lock(ctx context.Context, resource string, opts []Option, once bool) (l *Lock, err error) {
	if err := c.checkResource(resource); err != nil {
		return nil, err
	}
	cfg, err := buildConfig(c.cfg, opts, true)
	if err != nil {
		return nil, err
	}
	attempts := 0
	callID := c.ids.Add(1)
	if cfg.obs != nil { // WithHooks, WithLogger (hooks.go)
		done := c.observe(ctx, cfg, callID, resource, &attempts)
		defer func() { done(l, err) }()
	}
	if err := c.callerHolds(ctx, resource, cfg); err != nil {
		return nil, err // it would wait for itself (reentry.go)
	}
	if err := c.beginCall(cfg.nodeTimeout); err != nil {
		return nil, err
	}
	defer c.wg.Done() // ends beginCall
	if err := ctx.Err(); err != nil {
		// Done before anything was sent: the call says nothing about the
		// nodes or the holder, whether ctx was cancelled or its deadline
		// passed (issue 44 item 3).
		return nil, ctxDoneBefore(ctx)
	}
	if !once {
		if cfg.mode != ModeRead { // readers share: they do not take turns (rwlock.go)
			// Fairness within this Client: its Lock calls on one resource
			// take turns in arrival order, and only the first contends on
			// the nodes; a lock unlocked may pass to the next without a
			// round trip (cohort.go). A goroutine that unlocks and locks
			// again goes to the back.
			return c.inLine(ctx, callID, resource, cfg, &attempts)
		}
		return c.acquire(ctx, callID, resource, cfg, &attempts)
	}
	l, err = c.newLock(resource, cfg, "")
	if err != nil {
		return nil, err
	}
	attempts = 1
	o := c.attempt(ctx, callID, l, scripts.Waiter{}, nil)
	if o.err == nil {
		if l.handOut() {
			return l, nil
		}
		// Validity ran out between the decision and here (the process
		// was starved or paused): never hand out an expired lock.
		c.drop(ctx, l)
		return nil, grantExpired("granted, but its validity ran out before it could be returned")
	}
	c.abandonLate(ctx, l, o)
	if ctx.Err() != nil {
		return nil, errors.Join(o.err, ctx.Err())
	}
	return nil, o.err
}

// acquire is Lock's retry loop, the one loop of a Lock call (DESIGN steps
// 1-3, 6 and 9): attempt (step: a round, or a key handed to us), give back
// what a failed attempt left (giveBack), wait (waiting.wait). One token
// serves the whole call, so that the waiter queued on the nodes (step 9)
// is the one a release hands the key to; a token is replaced only when a
// grant expired or an attempt ended with a request of ours unanswered that
// could still change the key (see giveBack).
//
// It returns at the first of these, checked in this order:
//
//  1. no token can be made (crypto/rand failed): that error; nothing sent.
//  2. the wake-up registration fails (startWaiting): that error; nothing
//     sent.
//  3. an attempt made the lock ours and it is still valid (handOut): the
//     lock. A grant whose validity ran out before this check is dropped
//     and counts as a refusal (ErrNotObtained, ErrGrantExpired) on a fresh
//     token, or, when none can be made, that error.
//  4. the Client was closed during the attempt: ErrClosed.
//  5. ctx ended: the error of the last attempt that settled anything (an
//     attempt cut short by ctx says nothing about the nodes), joined with
//     ctx's error.
//  6. the attempt's error is permanent (a node's answer no retry changes,
//     see isPermanent): that error.
//  7. WithRetryCount attempts were made: the last settled attempt's error
//     (ErrNotObtained, or ErrNoQuorum joined with a *NodeError per node).
//  8. a request of the attempt is still unanswered and no fresh token can
//     be made: that error.
//  9. while waiting for the next attempt (waiting.wait): the wake-up
//     registration fails (that error), ctx ends (the attempt's error joined
//     with ctx's), or the Client closes (ErrClosed).
//
// Every exit after 3 first abandons the token: what it may have set is
// released in the background (abandon). Nothing slow runs between a grant
// and the return (step 6): leaving the wake-up registry and this Client's
// line only unregisters, and the lock's validity is checked last, so an
// expired lock is never returned.
func (c *Client) acquire(ctx context.Context, callID uint64, resource string, cfg config, attempts *int) (*Lock, error) {
	l, err := c.newLock(resource, cfg, "")
	if err != nil {
		return nil, err // 1
	}
	q, err := c.startWaiting(ctx, l, cfg)
	if err != nil {
		return nil, err // 2
	}
	defer q.stop()
	var verdict error // the error of the last attempt that settled anything
	for attempt := 1; ; attempt++ {
		*attempts = attempt
		o := q.step(ctx, callID, l, attempt)
		t, err, settled := o.t, o.err, o.settled
		if err == nil {
			q.noteDequeued(l)
			if l.handOut() {
				return l, nil // 3
			}
			// Validity ran out between the decision and here (the process
			// was starved or paused): never hand out an expired lock.
			c.drop(ctx, l)
			if l, err = q.retoken(l); err != nil {
				return nil, err // 3, no token
			}
			err, settled = grantExpired("granted, but its validity ran out before Lock could return it"), true
			t = quorum.Tally{} // the grants were the dropped token's, released by drop
		}
		if errors.Is(err, ErrClosed) {
			c.abandon(ctx, l, t)
			return nil, err // 4
		}
		if settled {
			verdict = err
		} else if verdict != nil {
			err = verdict
		}
		if ctx.Err() != nil || isPermanent(err) || (cfg.retryCount > 0 && attempt >= cfg.retryCount) {
			c.abandon(ctx, l, t)
			if ctx.Err() != nil {
				return nil, errors.Join(err, ctx.Err()) // 5
			}
			return nil, err // 6, 7
		}
		// Between attempts: grants of a failed attempt go to waiters
		// before us (or back, without a queue), so that split votes
		// settle. Without the queue, those that answered after its
		// decision too (final); a queued call does not wait for them (a
		// paused node would hold up its wake-up by a node timeout: a
		// handover took 2s) and yields them at its next attempt.
		if !cfg.wakeUp {
			t = c.final(l, o.r, t)
		}
		if !q.giveBack(ctx, l, t) {
			c.abandon(ctx, l, quorum.Tally{})
			var terr error
			if l, terr = q.retoken(l); terr != nil {
				return nil, terr // 8
			}
		}
		if err := q.wait(ctx, l, t, err); err != nil {
			c.abandon(ctx, l, quorum.Tally{})
			return nil, err // 9
		}
	}
}

// newLock returns a lock for one Lock or TryLock call on resource, not yet
// held, with token, or with a fresh one when token is "" (Resume gives
// its own).
func (c *Client) newLock(resource string, cfg config, token string) (*Lock, error) {
	if token == "" {
		id, err := uuid.NewRandom() // v4, 122 bits from crypto/rand
		if err != nil {
			return nil, fmt.Errorf("redlock: token: %w", err)
		}
		token = id.String()
	}
	n := len(c.nodes)
	l := &Lock{
		lease: &lease{
			c:        c,
			resource: resource,
			keys:     make([]scripts.Keys, n),
			token:    token,
			cfg:      cfg,
			state:    stateFinished, // held only once hold has run
		},
		lost:     make(chan struct{}),
		lostDone: make(chan struct{}),
	}
	l.cur = l
	for i := range c.nodes {
		// Plain nodes share one set of keys; Cluster nodes need hash tags.
		if i > 0 && !c.nodes[i].Cluster && !c.nodes[i-1].Cluster {
			l.keys[i] = l.keys[i-1]
			continue
		}
		l.keys[i] = c.nodes[i].lockKeys(c.cfg.keyPrefix, resource, cfg, l.token) // by kind (Mode)
	}
	l.tok = c.set.Token(l.keys, cfg.ttl, cfg.nodeTimeout, &l.mu, &c.wg, (*owner)(l))
	return l, nil
}

// outcome is what one attempt came to: the tally of its round (phase 1),
// the round (nil when none was sent: a handoff), its error, and whether it
// settled anything: false when ctx ended before the nodes that could have
// made the difference answered.
type outcome struct {
	t       quorum.Tally
	r       *quorum.Round[reply]
	err     error
	settled bool
}

// attempt is one acquisition round for l (DESIGN steps 1–3, and 8 with
// fencing), queued as w says (its zero value: not queued): on success l is
// held. With h (nil: none), a key handed to the attempt by a node that
// refused it counts too (see inFlight).
func (c *Client) attempt(ctx context.Context, callID uint64, l *Lock, w scripts.Waiter, h *inFlight) (o outcome) {
	cfg := l.cfg
	if obs := cfg.obs; obs != nil { // WithHooks, WithLogger (hooks.go)
		start := time.Now()
		defer func() {
			obs.Attempt(ctx, AttemptInfo{Call: callID, Resource: l.resource, Latency: time.Since(start), Granted: o.t.Yes, Pending: o.t.Pending,
				Quorum: c.quorum, Nodes: len(c.nodes), Outcome: outcomeOf(o.err), Err: o.err, NodeErrors: c.nodeErrors(o.t)})
		}()
	}
	// The arguments are boxed once for every node; each node's not-after
	// bound (step 4) is the node layer's.
	args := scripts.AcquireArgs(l.token, cfg.ttl, w, c.wakeArgs)
	// Step 1: one parallel round on every node, after our own releases of
	// the key in flight as it is registered (node.Op.Follow).
	op := node.Op{Name: "acquire", Follow: true, Bound: true}
	if f := testhooks.AcquirePause.Load(); f != nil { // a test's late request
		op.Only = func(_ context.Context, i int) (bool, error) { (*f)(l.keys[i].Lock, i); return true, nil }
	}
	r, _ := node.Run(ctx, l.tok, op, func(ctx context.Context, i int, s redis.Scripter, notAfter *int64) (reply, error) {
		if cfg.restartGuard > 0 { // WithRestartGuard (guard.go)
			ok, fence, err := scripts.AcquireGuardedWith(ctx, s, l.keys[i], args, notAfter, cfg.restartGuard)
			return reply{ours: ok, fence: fence}, restartGuardError(err)
		}
		ok, fence, err := scripts.AcquireWith(ctx, s, l.keys[i], args, notAfter)
		return reply{ours: ok, fence: fence}, err
	})
	// Step 2: decide as soon as a majority granted or became impossible,
	// or, queued, granted or was handed to us (step 9).
	var t quorum.Tally
	if h == nil {
		t = r.CollectWake(ctx, classify, quorum.Majority, nil)
	} else {
		h.start = r.Started()
		t = r.CollectWake(ctx, classify, h.decide, h.wake())
		if until := h.until; !until.IsZero() && !t.Quorum() {
			return outcome{h.granted(t), r, c.hold(ctx, l, until, testhooks.FirstRenewal(firstRenewal(cfg, until), until)), true}
		}
		h.rewake()
	}
	// Step 3: validity, from before the first request was sent.
	if deadline, ok := r.Granted(t, cfg.ttl, cfg.drift); ok {
		if !cfg.fencing {
			return outcome{t, r, c.hold(ctx, l, deadline, 0), true}
		}
		t2 := c.commitFence(ctx, l, r)
		if t2.Quorum() && time.Now().Before(deadline) {
			return outcome{t, r, c.hold(ctx, l, deadline, 0), true}
		}
		err, settled := c.attemptError(t2, cfg, l.resource)
		return outcome{t, r, err, settled}
	}
	err, settled := c.attemptError(t, cfg, l.resource)
	return outcome{t, r, err, settled}
}

// reply is one node's answer to a lock script.
type reply struct {
	ours   bool  // the key holds our token there now
	healed bool  // extend set it again where it was absent
	fence  int64 // the node's fence counter (fenced acquire only)
}

func classify(_ int, rep quorum.Reply[reply]) (quorum.Vote, error) {
	switch {
	case rep.Err != nil:
		return quorum.Failed, rep.Err
	case rep.Val.ours:
		return quorum.Yes, nil
	}
	return quorum.No, nil
}

// hold turns a granted attempt into a held Lock, registered with the Client
// (so Close releases it). The renewal scheduler watches it only from Lock's
// last check on (handOut): a lock whose validity runs out before that check
// is dropped, and never reported lost. Its first renewal comes after first
// (0: the renew interval).
func (c *Client) hold(ctx context.Context, l *Lock, validUntil time.Time, first time.Duration) error {
	l.firstRenewal = first
	l.mu.Lock()
	l.state = stateHeld
	l.validUntil = validUntil
	l.mu.Unlock()
	l.acquired = time.Now()
	l.taken = l.acquired
	l.id = c.ids.Add(1)
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	l.outer, l.ctx = heldBy(ctx), context.WithValue(l.ctx, holderKey{}, l) // a call on this ctx is the holder's (reentry.go)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		l.finish(ErrClosed)
		return ErrClosed
	}
	c.locks[l] = struct{}{}
	c.held[l.resource]++
	c.mu.Unlock()
	if f := testhooks.AfterHold.Load(); f != nil {
		(*f)(l.resource)
	}
	return nil
}
