package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// Detach hands the lock over without releasing it: renewal stops, the
// Client forgets the lock (Close will not release it), Context is cancelled
// with cause ErrDetached, and Lost is not closed. The keys stay on the nodes
// until their TTL runs out, unless another process takes the lock over with
// Resume(resource, token) and renews it. After Detach, Unlock and Extend
// return ErrNotHeld without I/O, and Valid is false. Give the other process
// Resource and Token (the token is a secret: pass it as one, never log it).
//
// The next owner knows nothing of this Client's requests, so Detach hands
// over only what it can no longer change (DESIGN step 4): it waits until
// no request of the lock sent by this Client can land on a node any more —
// at once when every one was answered; when one went unanswered (a slow or
// paused node), until its not-after bound has passed on that node, about
// twice the node timeout at most. And it takes the lock's entry out of the
// nodes' waiter queues (a Lock call that waited leaves one where a node
// refused it), since the next owner's release cannot: one request per
// node, each bounded by the node timeout (a node that does not answer
// drops the entry when it lapses).
//
// Only a plain lock (Lock, TryLock, a Semaphore's permit) is handed over:
// Resume takes a resource and a token, and knows nothing of a read-write
// lock's reader or writer or a multi-lock's resources, so it could never
// take those over, and their keys would stay for a TTL with nobody
// holding them. Detach refuses them with ErrInvalidArgument and changes
// nothing: the lock stays held and renewed.
//
// Detach returns ErrNotHeld when the lock is not held (unlocked, lost,
// detached, or nil), ErrInvalidArgument for a kind Resume cannot take,
// ErrClosed after Close.
func (l *Lock) Detach() error {
	if l == nil {
		return ErrNotHeld
	}
	if m := l.cfg.mode; m != ModeMutex {
		return invalid("Detach: a %s lock cannot be handed over: Resume takes plain locks only", m)
	}
	c := l.c
	if err := c.begin(); err != nil {
		return err
	}
	defer c.wg.Done()
	if !l.holds() {
		return ErrNotHeld // without waiting for an Unlock under way (it may wait for a Lost hook)
	}
	// One of Detach and Unlock: under relMu, an Unlock that passed the
	// lease on (cohort.go) or released it has moved cur or the state.
	l.relMu.Lock()
	defer l.relMu.Unlock()
	l.mu.Lock()
	held := l.state == stateHeld && l.cur == l
	h := l.handle
	l.mu.Unlock()
	if !held {
		return ErrNotHeld
	}
	defer c.cohortFree(l.lease) // the next Lock call of the line contends (cohort.go)
	if h != nil {
		h.Stop()
	}
	l.detached.Store(true)
	l.finish(ErrDetached) // from here no round of the lock is registered (rounds.go)
	l.tok.WaitOut()
	l.leaveQueues()
	return nil
}

// leaveQueues takes l's waiter member out of every node's queue, bounded by
// the node timeout (see Detach).
func (l *Lock) leaveQueues() {
	if l.waiter.Member == "" || queuesFor(l.cfg.mode) {
		return // never queued, or the read-write queue, which Detach does not hand over
	}
	ctx := context.Background()
	r, _ := node.Run(ctx, l.tok, node.Op{Name: "release", Release: true}, func(ctx context.Context, i int, s redis.Scripter, _ *int64) (struct{}, error) {
		return struct{}{}, scripts.Leave(ctx, s, l.keys[i], l.waiter)
	})
	r.Collect(ctx, func(_ int, rep quorum.Reply[struct{}]) (quorum.Vote, error) { return quorum.Yes, rep.Err }, quorum.All)
}

// Resume takes over the lock on resource whose token is token, held by
// another process or Client (a scheduler acquires, Detaches and hands the
// lock to a worker, which resumes, renews and releases it, as aioredlock's
// get_lock and redis-semaphore's acquiredExternally do). It first asks every
// node whether the key holds token, writing nothing; only when a majority
// says so does it send a second round, which re-arms the TTL where the key
// still holds token and sets the key nowhere: the lock is resumed only if
// a majority re-armed it in that round, and a node that lost the key gets
// it again from the lock's first renewal, after that majority confirmed
// (scheduled at once when any node did not confirm, pending ones included). A refused Resume so
// never writes the token anywhere: it can never revive a lock that expired
// or was released, also between its two rounds (then it returns an error
// matching ErrNotHeld). The returned *Lock is then
// renewed, reported lost, Extended and Unlocked by this Client as if it had
// acquired it, with the per-call options opts (WithTTL sets the lease it
// renews to; WithMaxHold counts from the resume). Its Fence is 0: fencing
// tokens are not carried over, pass the holder's Fence along with the
// token.
//
// Resume does not stop the previous holder: it must Detach the lock (or
// stop using and renewing it) first, or both would act on one lock.
//
// ctx bounds the call. It returns an error matching ErrNotHeld when the
// nodes that answered show that no majority holds token for resource (the
// lock expired, was released, or the token is wrong), after releasing the
// token where a node still held it (Resume waits for a majority of
// answers, as Unlock does); ErrNoQuorum with the node errors when too few
// nodes answered to tell, in either round (the keys that held the token
// are left alone then, so Resume may be retried); ErrInvalidArgument for
// an empty resource, a token that is not one this library makes (a
// UUID), bad options, or a token this Client already holds; ErrClosed
// after Close;
// ctx's error alone when ctx was done before the call (nothing is sent).
func (c *Client) Resume(ctx context.Context, resource, token string, opts ...Option) (*Lock, error) {
	if err := c.checkResource(resource); err != nil {
		return nil, err
	}
	cfg, err := buildConfig(c.cfg, opts, true)
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
	defer c.wg.Done()
	c.noteTimeout(cfg.nodeTimeout)
	if c.holdsToken(token) {
		return nil, invalid("Resume: this Client holds that lock already")
	}
	if ctx.Err() != nil {
		return nil, ctxDoneBefore(ctx) // nothing sent, nothing known (issue 44 item 3)
	}
	l, err := c.newLock(resource, cfg, token) // token is a UUID, never ""
	if err != nil {
		return nil, err
	}
	n := len(c.nodes)
	// Ask first, write nothing: heal absent nodes only once a majority
	// confirmed the token (DESIGN step 4).
	r, _ := node.Run(ctx, l.tok, node.Op{Name: "resume"}, func(ctx context.Context, i int, s redis.Scripter, _ *int64) (reply, error) {
		ok, err := scripts.Holds(ctx, s, l.keys[i], token)
		return reply{ours: ok}, err
	})
	t := r.Collect(ctx, classify, quorum.Majority)
	if f := testhooks.ResumeRead.Load(); f != nil {
		(*f)(resource)
	}
	if t.Quorum() {
		// Re-arm only where the key still holds the token, and set it
		// nowhere it is absent (issue 44 item 5): a key that expired
		// between the two rounds stays gone, and the lock is resumed only
		// if a majority still held the token in this round. Absent nodes
		// are healed by the lock's first renewal, after that majority
		// confirmed, as any renewal heals them.
		rearm := make([]scripts.Prepared, n)
		for i, k := range l.keys {
			rearm[i] = scripts.PrepareRearm(k, token, cfg.ttl)
		}
		r2, _ := l.startExtend(ctx, false, rearm) // extend.go
		t2 := r2.Collect(ctx, classify, quorum.Majority)
		deadline := quorum.Deadline(r2.Started(), cfg.ttl, cfg.drift)
		if t2.Quorum() && quorum.Validity(cfg.ttl, t2.Elapsed, cfg.drift) > 0 {
			first := time.Duration(0) // the renew interval
			// Heal now the nodes that did not confirm: the round stops at a
			// majority, so some may not have answered yet (issue 44 review D3).
			if t2.Yes < n {
				first = time.Millisecond
			}
			if err := c.hold(ctx, l, deadline, first); err != nil {
				c.abandon(ctx, l, quorum.Tally{})
				return nil, err
			}
			if l.handOut() {
				return l, nil
			}
			c.drop(ctx, l)
			return nil, fmt.Errorf("%w: Resume(%q): its validity ran out before Resume could return it", ErrNotHeld, resource)
		}
		if t2.No > n-c.quorum {
			// Lost between the two rounds: what a minority still holds is
			// released, after the re-arm requests there (abandon's guards,
			// step 4).
			c.abandon(ctx, l, quorum.Tally{})
			return nil, c.joinNodeErrors(fmt.Errorf("%w: Resume(%q): the token was gone from %d of %d nodes when Resume re-armed it (expired or released after Resume read it)", ErrNotHeld, resource, t2.No, n), t2)
		}
		// Too few answers, or too slow: the lock may still be valid, and
		// the re-arm wrote no key, so the keys are left alone, as after a
		// first round without quorum, and Resume may be retried (issue 44
		// review D4; it used to release them). The lock was never held
		// (newLock) and nothing is released, so a re-arm request
		// still in flight lands after no release of ours; its not-after
		// bound voids it if it lands late.
		return nil, c.joinNodeErrors(fmt.Errorf("%w: Resume(%q): %d of %d nodes confirmed the extension, %d needed", ErrNoQuorum, resource, t2.Yes, n, c.quorum), t2)
	}
	switch {
	case t.No > n-c.quorum:
		// No majority holds the token: the lock is gone. Nothing was
		// written; the keys a minority still holds are released now.
		l.mu.Lock()
		l.state = stateFinished
		l.mu.Unlock()
		_ = l.release(ctx, nil)
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
		ok := l.returned && l.cur == l && l.state == stateHeld && time.Now().Before(l.validUntil)
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
