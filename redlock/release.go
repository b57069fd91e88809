package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// releaseMany releases locks on every node for Close (step 4): per node,
// pipelines of the release script, closeChunk locks each, one after the
// other for as long as the node answers them, however many locks there
// are; a node that does not answer one within timeout is left to the
// keys' TTLs. After the locks, each node is sent the releases the
// Client's retry loop still had pending for it. Nodes run in parallel.
// Each lock is then decided as by Unlock, and reported to its hooks; the
// errors of locks that too few nodes released are returned.
func (c *Client) releaseMany(locks []*Lock, timeout time.Duration) []error {
	n, k := len(c.nodes), len(locks)
	start := time.Now()
	wasLost := make([]bool, k)
	args := make([]*relArgs, k)
	for j, l := range locks {
		l.mu.Lock()
		wasLost[j] = l.state == stateLost
		l.mu.Unlock()
		args[j] = l.releaseArgs()
	}
	outs := make([]closeOutcome, n)
	var g errgroup.Group // zero Group: a node that fails stops no other
	for i := range n {
		g.Go(func() error {
			outs[i] = c.closeNode(i, locks, args, timeout)
			return nil
		})
	}
	_ = g.Wait()
	if k == 0 {
		return nil
	}
	elapsed := time.Since(start)
	ctx := context.Background()
	var errs []error
	for j, l := range locks {
		lt := quorum.Tally{Votes: make([]quorum.Vote, n), Errs: make([]error, n), Elapsed: elapsed}
		for i := range n {
			o := &outs[i]
			var err error
			ok := false
			if err = o.err(j); err == nil {
				ok = o.res[j] == scripts.Deleted || o.res[j] == scripts.HandedOver
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
			obs.Release(ctx, ReleaseInfo{Lock: l.id, Resource: l.resource, Latency: elapsed, HeldFor: time.Since(l.acquired),
				WasLost: wasLost[j], Released: lt.Yes, Err: err, NodeErrors: c.nodeErrors(lt)})
		}
		if err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, fmt.Errorf("release %q: %w", l.resource, err))
		}
	}
	return errs
}

// closeChunk is how many releases Close sends a node in one pipeline, and
// closeDepth how many such pipelines it keeps in flight on one node: a
// chunk is some milliseconds of work (more on a loaded client), so that
// the node timeout bounds one chunk, not all of them, and the node is kept
// busy while the client encodes the next chunk.
const (
	closeChunk = 128
	closeDepth = 2
)

// closeOutcome is what one node did with Close's releases: per lock, the
// release's outcome, or an error (per chunk: the node's; per lock: an
// error reply).
type closeOutcome struct {
	res      []scripts.Released
	errs     map[int]error // error replies, per lock
	chunkErr []error       // per chunk: the node did not answer it (or it was not sent)
}

// err returns the error of lock j's release on the node, nil if released
// or not ours.
func (o *closeOutcome) err(j int) error {
	if err := o.chunkErr[j/closeChunk]; err != nil {
		return err
	}
	return o.errs[j]
}

// closeNode sends node i the releases of locks, chunk after chunk
// (closeDepth at once) for as long as the node answers each within
// timeout, then the releases its retry loop still had pending (step 4). A
// chunk the node does not answer stops the node: the chunks not sent yet
// are left to the keys' TTLs. The loop is stopped first, and waited for
// (its round is bounded by the node timeout) before its releases are
// taken.
func (c *Client) closeNode(i int, locks []*Lock, args []*relArgs, timeout time.Duration) closeOutcome {
	exited := c.rel.stopNode(i)
	chunks := (len(locks) + closeChunk - 1) / closeChunk
	o := closeOutcome{res: make([]scripts.Released, len(locks)), chunkErr: make([]error, chunks)}
	var mu sync.Mutex // protects o.errs and stopped
	var stopped error // the first chunk the node did not answer
	send := func(count int, queue func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd) ([]*redis.Cmd, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return call(c, ctx, i, site{c.cfg.obs, "release", ""}, func(ctx context.Context, _ redis.Scripter) ([]*redis.Cmd, error) {
			return pipelined(ctx, c.nodes[i].c, count, scripts.ReleaseScript, func(p redis.Pipeliner, j int) *redis.Cmd {
				return queue(ctx, p, j)
			})
		})
	}
	var g errgroup.Group
	g.SetLimit(closeDepth)
	for ch := range chunks {
		g.Go(func() error { // waits for a place: at most closeDepth at once
			mu.Lock()
			err := stopped
			mu.Unlock()
			if err != nil {
				o.chunkErr[ch] = err
				return nil
			}
			lo := ch * closeChunk
			part := locks[lo:min(lo+closeChunk, len(locks))]
			cmds, err := send(len(part), func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd {
				l := part[j]
				return scripts.ReleaseCmd(ctx, p, l.keys[i], l.argsFor(args[lo+j], i))
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				o.chunkErr[ch] = err
				if stopped == nil {
					stopped = err
				}
				return nil
			}
			for j, cmd := range cmds {
				r, err := scripts.ReleaseResult(cmd)
				o.res[lo+j] = r
				if err != nil {
					if o.errs == nil {
						o.errs = make(map[int]error)
					}
					o.errs[lo+j] = &NodeError{Node: i, Addr: c.nodes[i].addr, Err: err}
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	<-exited
	es := c.rel.drain(i)
	for stopped == nil && len(es) > 0 {
		part := es[:min(closeChunk, len(es))]
		es = es[len(part):]
		if _, err := send(len(part), func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd {
			return scripts.ReleaseCmd(ctx, p, part[j].keys, part[j].args)
		}); err != nil {
			break // left to the keys' TTLs
		}
	}
	return o
}

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
// released in the background either way.
func (l *Lock) Unlock(ctx context.Context) error {
	if l == nil || l.detached.Load() {
		return ErrNotHeld // handed over by Detach: not ours to release
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

// release runs check-and-delete on every node (step 6) and waits until a
// majority confirmed it, or could not (step 4); it reports to the hooks.
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

// releaseAll releases the lock on every node at once and returns once a
// majority answered, or can no longer (step 4). The requests go out even
// if ctx is done; the rest finish on the Client's goroutines, and a node
// that does not confirm gets the release again from its retry loop.
func (l *Lock) releaseAll(ctx context.Context) quorum.Tally {
	dctx := context.WithoutCancel(ctx)
	args := l.releaseArgs()
	q := l.c.quorum
	r := quorum.Start(dctx, len(l.c.nodes), l.cfg.timeout(), &l.c.wg, func(ctx context.Context, i int) (bool, error) {
		return l.releaseNode(ctx, i, args)
	})
	return r.Collect(dctx, voteReleased, func(t quorum.Tally) bool {
		answered := t.Yes + t.No
		// A majority that confirmed, one of them holding our token: a lock
		// held on a majority always gets here at once (any majority meets
		// it). With none of them holding it, the others may still say
		// whether any node did (ErrNotHeld or nil), within the node timeout.
		return answered >= q && (t.Yes > 0 || t.Pending == 0) || answered+t.Pending < q
	})
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

// releaseNode releases the key on node i (steps 4, 6 and 9): hands it to
// the first waiter queued there or deletes it, takes our own queue entry
// out, and, when a request of this lock may still be in flight there,
// leaves the token's guard, so that the request sets nothing when it lands,
// whatever the key holds then. A release the node did not confirm becomes
// pending with the node's retry loop (see needsRetry).
func (l *Lock) releaseNode(ctx context.Context, i int, args *relArgs) (bool, error) {
	if args == nil {
		args = l.releaseArgs()
	}
	ok, err := call(l.c, ctx, i, site{l.cfg.obs, "release", l.resource}, func(ctx context.Context, s redis.Scripter) (bool, error) {
		a := l.argsFor(args, i)
		r, err := scripts.ReleaseWith(ctx, s, l.keys[i], a)
		return r == scripts.Deleted || r == scripts.HandedOver, err
	})
	if l.needsRetry(i, err) {
		l.c.rel.add(i, l, unsent(err))
	}
	return ok, err
}

// needsRetry reports whether a release to node i that failed with err must
// be sent again: always when the node may have it (a timeout, a broken
// connection), was busy, or answered with an error; when the request never
// left the client (a refused dial), only if a request of the lock may still
// land there: nothing else of ours can be on a node we cannot reach.
func (l *Lock) needsRetry(i int, err error) bool {
	var re redis.Error
	switch {
	case err == nil:
		return false
	case errors.Is(err, errBusy), errors.As(err, &re):
		return true
	case unsent(err):
		// A request of the lock still in flight there may turn out to
		// have never left the client either (a node that refuses every
		// dial fails them all): the retry loop asks again (moot).
		return l.guardFor(i) > 0
	}
	return true
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
	return l.c.guardLifetime(l.keys, l.cfg.ttl, l.cfg.timeout())
}

// inflight is a round of requests of this lock, seen by release: where a
// node has not answered it, a request may still land after the release.
type inflight interface {
	answered(i int) bool // node i's reply is in (not a timeout or a connection error)
	settled() bool       // every node has answered or given up
}

// answered reports whether a request that ended with err can no longer
// change anything on the node: the node replied (a result, an error reply,
// or scripts.ErrLate: it ran past its not-after bound and changed nothing),
// or the request never left the client (see unsent). A timeout or a broken
// connection leaves it unknown whether (and when) the request reaches the
// node.
func answered(err error) bool {
	if err == nil {
		return true // before the errors.As target, which escapes
	}
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, scripts.ErrLate) || unsent(err)
}

// roundRef is a round of this lock alone.
type roundRef struct{ r *quorum.Round[reply] }

func (p roundRef) answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && answered(rep.Err) // a request never sent (see unsent) cannot land either
}

func (p roundRef) settled() bool { return p.r.Settled() }

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
