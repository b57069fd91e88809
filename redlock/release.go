package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// Unlock stops the renewal (waiting for one in flight), cancels Context with
// cause ErrUnlocked, and runs check-and-delete on every node — also after
// the lock was lost, since the key may still be ours on some nodes. The
// release goes out even if ctx is already done (on a context without its
// cancellation), bounded by the node timeout.
//
// Unlock returns as soon as a majority of nodes confirmed the release
// (DESIGN step 4): the Client, not the caller, finishes the release on the
// other nodes, retrying in the background on nodes that are slow, paused or
// unreachable until each answers (Close waits for them, bounded by the node
// timeout plus a short grace). With one node of three paused, Unlock takes
// one round trip, not the node timeout.
//
// It returns nil when a majority confirmed the release and a node held our
// token (a lock still held on a majority always does: any majority meets
// it, so Unlock of a valid lock returns at the first majority); ErrNotHeld
// when a majority confirmed and no node that answered within the node
// timeout held our token: the lock had already expired, been lost, or
// been unlocked (Unlock then waits for the other nodes' answers, within
// the node timeout, to tell); ErrNoQuorum joined with the node errors when
// a majority could not confirm within the node timeout (keys left there
// are released in the background, or expire with their TTL); ErrClosed
// after Close. Nodes that had not answered when Unlock returned are
// released in the background either way. Unlock after an Unlock that
// returned nil or ErrNotHeld returns ErrNotHeld without I/O; after one
// that returned ErrNoQuorum it sends the release again.
//
// When another goroutine of this Client waits in Lock for the resource,
// Unlock may pass the lock to it instead, with no I/O (a local handoff,
// see WithLocalHandoff): Unlock returns nil, and this Lock is unlocked as
// after a release; the lease goes on under the other goroutine's *Lock.
func (l *Lock) Unlock(ctx context.Context) error {
	if l == nil || l.detached.Load() {
		return ErrNotHeld // handed over by Detach: not ours to release
	}
	c := l.c
	if err := c.begin(); err != nil {
		return err
	}
	defer c.wg.Done()
	// One Unlock of the lease at a time: a handle passed on (below) must
	// not stop the renewal of the lease its successor holds.
	l.relMu.Lock()
	defer l.relMu.Unlock()
	l.mu.Lock()
	cur, h := l.cur, l.handle // the handle that holds the lease now; l's renewal (set once, by handOut)
	l.mu.Unlock()
	if cur != l || l.detached.Load() {
		return ErrNotHeld // passed on (cohort.go), or Detached meanwhile: not ours any more
	}
	if c.handOn(ctx, l) {
		return nil
	}
	defer c.cohortFree(l.lease) // released: the next Lock call of the line contends
	if h != nil {
		h.Stop()
	}
	l.reportExpiry()
	l.finish(ErrUnlocked)
	if l.released {
		// An earlier Unlock reached a majority; the Client finishes the
		// rest. Sending again could find our key on a node the first
		// release has not reached yet and report nil for a lock that was
		// already unlocked.
		return ErrNotHeld
	}
	err := l.release(ctx, l.cfg.obs)
	if err == nil || errors.Is(err, ErrNotHeld) {
		l.released = true
	}
	return err
}

// release runs check-and-delete on every node at once (step 6,
// node.Release) and returns once a majority answered, or can no longer
// (step 4), with what Unlock returns for it (releaseError); obs, when set
// (Unlock's hooks; not for a lock the caller never saw), is told. The
// requests go out even if ctx is done; the rest finish on the Client's
// goroutines, and a node that does not confirm gets the release again from
// its retry loop.
func (l *Lock) release(ctx context.Context, obs Hooks) (err error) {
	c := l.c
	var t quorum.Tally
	if obs != nil {
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
	r := node.Release(ctx, l.tok, nil, (&relArgs{l: l}).send, l.retry)
	t = r.Collect(context.WithoutCancel(ctx), voteReleased, func(t quorum.Tally) bool {
		answered := t.Yes + t.No
		// A majority that confirmed, one of them holding our token: a lock
		// held on a majority always gets here at once (any majority meets
		// it). With none of them holding it, the others may still say
		// whether any node did (ErrNotHeld or nil), within the node timeout.
		return answered >= c.quorum && (t.Yes > 0 || t.Pending == 0) || answered+t.Pending < c.quorum
	})
	return l.releaseError(t)
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
		return c.joinNodeErrors(fmt.Errorf("%w: %d of %d nodes answered the release, %d needed; the Client retries the others in the background, keys left expire with their TTL", ErrNoQuorum, answered, n, c.quorum), t)
	case t.Yes == 0:
		return c.joinNodeErrors(ErrNotHeld, t)
	}
	return nil
}

// retry makes a release the node did not confirm pending with the node's
// retry loop (releaser.go), with the guard the node layer sized.
func (l *Lock) retry(p node.Part) {
	l.c.rel.add(p, scripts.ReleaseArgs(l.token, p.Guard, l.waiter, false, l.c.wakeArgs), l.cfg.ttl)
}

// relArgs are a release's arguments, boxed once for every node, as the
// first node that needs each form asks (forNode): plain, and with the
// token's guard, for nodes where a request of the lock may still be in
// flight (the node layer says: a guard > 0). Both carry our queue member,
// so that the script takes out any entry of ours left there: a release
// must never leave one for a later one to hand the key to a finished
// token. unqueued (for a lock some node handed the key to: l.dequeued)
// has no member: for a node whose handoff took out the entry of our
// latest attempt and where no request of ours is in flight, so that
// nothing of ours can have queued again (issue 32: the handing release's
// own lookup saved).
type relArgs struct {
	l                        *Lock      // whose release they are
	mu                       sync.Mutex // protects the rest
	plain, unqueued, guarded []any      // guarded: with the first guard a node needed
}

// send is what l's release sends node i (steps 4, 6 and 9), with the
// guard the node layer sized there: the release script, which hands the
// key to the first waiter queued there or deletes it, takes our own queue
// entry out, and leaves the guard, so that a request of ours still in
// flight sets nothing when it lands, whatever the key holds then.
func (a *relArgs) send(ctx context.Context, i int, s redis.Scripter, guard time.Duration) (bool, error) {
	r, err := scripts.ReleaseWith(ctx, s, a.l.keys[i], a.forNode(i, guard))
	return r == scripts.Deleted || r == scripts.HandedOver, err
}

// forNode returns the arguments for node i, with guard where the node
// layer sized one. The first guard a node needed serves every node of the
// release: it covers every request of the token, all registered before
// the release began.
func (a *relArgs) forNode(i int, guard time.Duration) []any {
	l := a.l
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case guard > 0:
		if a.guarded == nil {
			a.guarded = scripts.ReleaseArgs(l.token, guard, l.waiter, false, l.c.wakeArgs)
		}
		return a.guarded
	case a.plain == nil:
		a.plain = scripts.ReleaseArgs(l.token, 0, l.waiter, false, l.c.wakeArgs)
		if l.dequeued != nil {
			a.unqueued = scripts.Unqueued(a.plain)
		}
	}
	if a.unqueued != nil && l.dequeued[i] {
		return a.unqueued // no entry of ours can be left there
	}
	return a.plain
}

// releaseScript runs the release script on node i; yield is for a waiter
// giving its minority of grants to older waiters.
func (l *Lock) releaseScript(ctx context.Context, i int, s redis.Scripter, guard time.Duration, yield bool) (scripts.Released, error) {
	return scripts.Release(ctx, s, l.keys[i], l.token, guard, l.waiter, yield, l.c.wakeArgs)
}

// retryWindow is how long a release is retried on a node that does not
// answer: ten TTLs, at least a minute. A node down for longer has lost the
// key anyway (it expired there), and one paused for longer is a fault the
// guard cannot outlast either.
func retryWindow(ttl time.Duration) time.Duration { return max(10*ttl, time.Minute) }

// drop takes back a lock granted but never handed out: its renewal stops
// and it is released, without hooks (the caller never saw it).
func (c *Client) drop(ctx context.Context, l *Lock) {
	l.mu.Lock()
	h := l.handle
	l.mu.Unlock()
	if h != nil {
		h.Stop()
	}
	l.finish(nil)
	_ = l.release(ctx, nil)
}

// abandonLate is abandon for a refused TryLock (one round, never queued):
// a node that granted is released at once; a node that refused, with no
// request of ours unanswered there, holds nothing of ours; a node that had
// not answered when the call was decided is waited for in the background,
// as a straggler — released only if its answer is a grant or a failure, and
// with the token's guard if no answer comes within the node timeout (the
// release then goes after the request timed out, as step 4 asks, and the
// guard covers it if it lands later). On a contended key most stragglers
// refuse, so a refused TryLock costs them nothing more (issue 32 item 7;
// before, each got a guarded release at once). Close waits for these
// goroutines (c.wg), which end by the round's deadline.
//
// It waits only where the refusals alone decided the call (t.No > N - quorum,
// the ErrNotObtained case): the key is taken elsewhere, and the stragglers
// most likely refuse too. Where failed nodes decided it (ErrNoQuorum, e.g. 2
// of 4 nodes down, which fail before the live ones answer), the live nodes'
// answers are mostly grants: waiting for them would keep the key there one
// round trip after the call returned, so that a TryLock right after finds it
// held (TestReal_evenNNeedsThreeOfFour); those get abandon's release at once.
func (c *Client) abandonLate(ctx context.Context, l *Lock, o outcome) {
	t, r := o.t, o.r
	if r == nil || t.Votes == nil || l.waiter.Member != "" || t.No <= len(c.nodes)-c.quorum {
		c.abandon(ctx, l, t)
		return
	}
	l.mu.Lock()
	l.state = stateFinished
	l.mu.Unlock()
	deadline := r.Started().Add(l.cfg.nodeTimeout)
	vote := func(i int, wait bool) quorum.Vote {
		if v := t.Votes[i]; v == quorum.Yes || v == quorum.No {
			return v
		}
		if !wait {
			return quorum.Pending
		}
		// A straggler: wait for its answer, at most until its deadline.
		tm := time.NewTimer(time.Until(deadline))
		select {
		case <-r.Done(i):
		case <-tm.C:
		case <-c.closing:
		}
		tm.Stop()
		if rep, ok := r.Reply(i); ok && rep.Err == nil && !rep.Val.ours {
			return quorum.No
		}
		return quorum.Pending // a grant, a failure or no answer: released
	}
	node.Release(ctx, l.tok, vote, (&relArgs{l: l}).send, l.retry)
}

// abandon ends a Lock call's lock that was never handed out (step 4): it
// is released on every node where anything of ours may be (node.Release)
// — nodes that granted, nodes that have not answered (with the token's
// guard, so that an acquire still on its way sets nothing when it lands),
// and, for a queued call, every node, to take our queue entry out. The
// caller does not wait for it: the releases are sent at once on the
// Client's goroutines, and a node that does not confirm one gets it again
// from its retry loop, so a paused node never delays the caller's answer.
// t is the last attempt's tally (zero: release everywhere).
func (c *Client) abandon(ctx context.Context, l *Lock, t quorum.Tally) {
	l.mu.Lock()
	l.state = stateFinished
	l.mu.Unlock()
	queued := l.waiter.Member != "" // our queue entry must go from every node
	vote := func(i int, _ bool) quorum.Vote {
		if t.Votes == nil || queued {
			return quorum.Pending
		}
		return t.Votes[i]
	}
	node.Release(ctx, l.tok, vote, (&relArgs{l: l}).send, l.retry)
}
