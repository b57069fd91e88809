package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// releaseMany releases locks on every node for Close: per node, pipelines
// of the release script for all of them, so that a node that hangs costs
// one node timeout in all, not one per lock (step 4). Each lock is then
// decided as by Unlock, and reported to its hooks; the errors of locks
// that too few nodes released are returned.
func (c *Client) releaseMany(locks []*Lock, timeout time.Duration) []error {
	if len(locks) == 0 {
		return nil
	}
	n, k := len(c.nodes), len(locks)
	start := time.Now()
	wasLost := make([]bool, k)
	for j, l := range locks {
		l.mu.Lock()
		wasLost[j] = l.state == stateLost
		l.mu.Unlock()
	}
	ctx := context.Background()
	args := make([]*relArgs, k)
	for j, l := range locks {
		args[j] = l.releaseArgs()
	}
	r := quorum.Start(ctx, n, timeout, &c.wg, func(ctx context.Context, i int) ([]*redis.Cmd, error) {
		return call(c, ctx, i, site{c.cfg.obs, "release", ""}, func(ctx context.Context, _ redis.Scripter) ([]*redis.Cmd, error) {
			return pipelined(ctx, c.nodes[i].c, k, scripts.ReleaseScript, func(p redis.Pipeliner, j int) *redis.Cmd {
				l := locks[j]
				a := l.argsFor(args[j], i)
				return scripts.ReleaseCmd(ctx, p, l.keys[i], a)
			})
		})
	})
	t := r.Collect(ctx, func(_ int, rep quorum.Reply[[]*redis.Cmd]) (quorum.Vote, error) {
		if rep.Err != nil {
			return quorum.Failed, rep.Err
		}
		return quorum.Yes, nil
	}, quorum.All)
	var errs []error
	for j, l := range locks {
		lt := quorum.Tally{Votes: make([]quorum.Vote, n), Errs: make([]error, n), Elapsed: t.Elapsed}
		for i := range n {
			var err error
			ok := false
			if t.Votes[i] != quorum.Yes {
				err = t.Errs[i]
			} else {
				rep, _ := r.Reply(i)
				var r scripts.Released
				r, err = scripts.ReleaseResult(rep.Val[j])
				ok = r == scripts.Deleted || r == scripts.HandedOver
				if err != nil {
					err = &NodeError{Node: i, Addr: c.nodes[i].addr, Err: err}
				}
			}
			lt.Votes[i], lt.Errs[i] = voteReleased(i, quorum.Reply[bool]{Val: ok, Err: err})
			switch lt.Votes[i] {
			case quorum.Yes:
				lt.Yes++
			case quorum.No:
				lt.No++
			default:
				lt.Failed++
			}
		}
		err := l.releaseError(lt)
		if obs := l.cfg.obs; obs != nil {
			if wasLost[j] {
				<-l.lostDone // the Lost hook comes first
			}
			obs.Release(ctx, ReleaseInfo{Lock: l.id, Resource: l.resource, Latency: time.Since(start), HeldFor: time.Since(l.acquired),
				WasLost: wasLost[j], Released: lt.Yes, Err: err, NodeErrors: c.nodeErrors(lt)})
		}
		if err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, fmt.Errorf("release %q: %w", l.resource, err))
		}
	}
	return errs
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
	c.forget(l)
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
	args := l.releaseArgs()
	r := quorum.Start(dctx, len(l.c.nodes), l.cfg.timeout(), &l.c.wg, func(ctx context.Context, i int) (bool, error) {
		return l.releaseNode(ctx, i, args)
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
func (l *Lock) releaseNode(ctx context.Context, i int, args *relArgs) (bool, error) {
	if args == nil {
		args = l.releaseArgs()
	}
	ok, err := call(l.c, ctx, i, site{l.cfg.obs, "release", l.resource}, func(ctx context.Context, s redis.Scripter) (bool, error) {
		a := l.argsFor(args, i)
		r, err := scripts.ReleaseWith(ctx, s, l.keys[i], a)
		return r == scripts.Deleted || r == scripts.HandedOver, err
	})
	if retryable(err) {
		rctx := context.WithoutCancel(ctx)
		l.c.goCallback(func() { l.retryRelease(rctx, i) })
	}
	return ok, err
}

// relArgs are a release's arguments, boxed once for every node: plain, and
// with the token's guard, for nodes where a request of the lock may still
// be in flight (guardFor). Both carry our queue member, also to nodes that
// handed us the key (the handoff took it out there): an attempt refused
// there later may have queued it again, and a release must never leave it
// for a later one to hand the key to a finished token.
type relArgs struct{ plain, guarded []any }

// releaseArgs boxes the release's arguments once for every node. A node's
// need for the guard can only appear while a round is pending, so one seen
// here stays.
func (l *Lock) releaseArgs() *relArgs {
	args := &relArgs{plain: scripts.ReleaseArgs(l.token, 0, l.waiter, false, l.c.wakeArg())}
	for i := range l.keys {
		if l.guardFor(i) > 0 {
			args.guarded = l.guardArgs()
			break
		}
	}
	return args
}

// guardArgs are the release's arguments with the guard.
func (l *Lock) guardArgs() []any {
	return scripts.ReleaseArgs(l.token, l.guardTTL(), l.waiter, false, l.c.wakeArg())
}

// argsFor returns the arguments for node i: with the guard where a request of
// the lock may still be in flight there.
func (l *Lock) argsFor(args *relArgs, i int) []any {
	if l.guardFor(i) == 0 {
		return args.plain
	}
	if args.guarded == nil {
		return l.guardArgs()
	}
	return args.guarded
}

// releaseScript runs the release script on node i; yield is for a waiter
// giving its minority of grants to older waiters.
func (l *Lock) releaseScript(ctx context.Context, i int, s redis.Scripter, guard time.Duration, yield bool) (scripts.Released, error) {
	return scripts.Release(ctx, s, l.keys[i], l.token, guard, l.waiter, yield, l.c.wakeArg())
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
	if err == nil {
		return true // before the errors.As target, which escapes
	}
	var re redis.Error
	return errors.As(err, &re)
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

// retryRelease sends the release (with its guard) to node i again until
// the node answers, the Client closes, or retryWindow has passed. A node
// that was paused or unreachable during Unlock may still hold our key, or
// get it from a request of ours queued there that it runs when it resumes:
// the release must reach it, however long the pause. Retries come at most
// every TTL/8 (and at least every second), so that a key a resumed node
// sets again from such a request is deleted again soon. A new connection
// to a paused node hangs in its handshake, so the release cannot wait in
// the node's socket buffer as the request did: it has to be sent again.
func (l *Lock) retryRelease(ctx context.Context, i int) {
	deadline := time.Now().Add(retryWindow(l.cfg.ttl))
	most := max(min(l.cfg.ttl/8, time.Second), 10*time.Millisecond)
	delay := min(max(l.cfg.timeout(), 10*time.Millisecond), most)
	t := time.NewTimer(delay)
	defer t.Stop()
	args := l.guardArgs()
	for {
		select {
		case <-t.C:
		case <-l.c.closing:
			return
		}
		rctx, cancel := context.WithTimeout(ctx, l.cfg.timeout())
		_, err := call(l.c, rctx, i, site{l.cfg.obs, "release", l.resource}, func(ctx context.Context, s redis.Scripter) (scripts.Released, error) {
			return scripts.ReleaseWith(ctx, s, l.keys[i], args)
		})
		cancel()
		if answered(err) || time.Now().After(deadline) {
			return
		}
		delay = min(2*delay, most)
		t.Reset(delay)
	}
}

// retryWindow is how long a release is retried on a node that does not
// answer: ten TTLs, at least a minute. A node down for longer has lost the
// key anyway (it expired there), and one paused for longer is a fault the
// guard cannot outlast either.
func retryWindow(ttl time.Duration) time.Duration { return max(10*ttl, time.Minute) }

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

// beginRound registers a round of a held lock before its requests go out,
// in one step with the check that the lock is held and valid (under l.mu,
// as Unlock's finish changes the state): a release that comes later sees
// the round pending — every node unanswered, so it leaves the guard — and
// a round that would come after the release is never sent. It returns
// the error of usable otherwise.
func (l *Lock) beginRound() (*pendingRound, error) {
	for {
		l.mu.Lock()
		if l.state == stateHeld && time.Now().Before(l.validUntil) {
			p := &pendingRound{}
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

// pendingRound is a round registered before it is sent (beginRound):
// unanswered everywhere until attach gives it its requests.
type pendingRound struct{ r atomic.Pointer[inflight] }

func (p *pendingRound) attach(r inflight) { p.r.Store(&r) }

func (p *pendingRound) answered(i int) bool {
	r := p.r.Load()
	return r != nil && (*r).answered(i)
}

func (p *pendingRound) settled() bool {
	r := p.r.Load()
	return r != nil && (*r).settled()
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
