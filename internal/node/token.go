package node

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// Token is the node layer's unit: one lock token on the nodes of a Set,
// through which its rounds and its releases go (DESIGN step 4). It keeps
// the registry of the token's requests that may still land on a node, and
// one rule, here and nowhere else: a round is registered — its start,
// hence its deadline and every request's not-after bound, fixed — before
// any point where it can be delayed (a goroutine switch, a queue, a
// retry). Register does that, under its owner's lock in one step with the
// check that the token may still send; Send sends the round from the start
// fixed there. So a round registered before a release has its deadline at
// most a node timeout after the release, however late its goroutine gets
// to send it, and the release's guard covers it (Guard); a round that
// would come after the release is never registered, so never sent.
//
// Make one with Set.Token: a Token must know its nodes, or a round that
// settled without an answer from a node could be dropped without the node
// being remembered as unsure.
type Token struct {
	n            int
	set          *Set           // nil in tests of the registry alone
	keys         []scripts.Keys // per node
	ttl, timeout time.Duration  // the lock's TTL and node timeout

	mu     sync.Mutex // protects rounds, unsure
	rounds []Inflight // rounds with requests maybe still in flight
	unsure []bool     // per node (nil: none): a request there went unanswered
}

// Token returns the node layer's unit for one lock token whose keys are
// keys (one per node), with the lock's TTL and node timeout.
func (s *Set) Token(keys []scripts.Keys, ttl, timeout time.Duration) *Token {
	return &Token{n: len(s.Nodes), set: s, keys: keys, ttl: ttl, timeout: timeout}
}

// Inflight is a round of requests of one token, seen by its release: where
// a node has not answered it, a request may still land after the release.
type Inflight interface {
	Answered(i int) bool // node i's reply is in, or its request provably never left (see Answered)
	Settled() bool       // every node has answered or given up
}

// Pending is a registered round: unanswered everywhere until Send (or
// Attach) gives it its requests. Start is write-once, before the round is
// visible to anyone.
type Pending struct {
	Start time.Time
	r     Inflight    // written once by Attach, before attached is set
	sent  atomic.Bool // r is set
	// before are, per node, the Client's own releases of the token's keys
	// in flight when the round was registered, which its requests follow
	// (Token.Follow; nil: none).
	before [][]chan struct{}
	// bounds are, per node, the not-after bound its request carries
	// (Request), in small when there are few nodes.
	bounds []int64
	small  [5]int64
}

// Register registers a round of the token that starts now, before
// anything of it is sent, under lk and only if open (nil: always) reports
// that the token may still send then: lk is the lock under which its
// owner ends the token (a release, a handover), so a release that comes
// later sees the round pending — every node unanswered, so it leaves the
// guard — and a round that would come after it is never registered. It
// reports false when open did not.
func (g *Token) Register(lk sync.Locker, open func() bool) (*Pending, bool) {
	lk.Lock()
	defer lk.Unlock()
	if open != nil && !open() {
		return nil, false
	}
	p := &Pending{Start: time.Now()}
	if g.n <= len(p.small) {
		p.bounds = p.small[:g.n]
	} else {
		p.bounds = make([]int64, g.n)
	}
	g.Track(p)
	return p, true
}

// Follow makes the requests of the round p, just registered, go on each
// node after the Client's own releases of the token's keys in flight there
// now (Set.ReleaseBegin): an acquire's, so that its own leftovers never
// refuse it. A release that begins later is never one it must follow, and
// may be its own call's cleanup, which waits for the request's answer.
func (g *Token) Follow(p *Pending) {
	p.before = g.set.releasesBefore(g.keys)
}

// ReleaseBegin registers a release of the token on node i (Set.ReleaseBegin).
func (g *Token) ReleaseBegin(i int) (done func()) { return g.set.ReleaseBegin(g.keys[i], i) }

// Request runs fn on node i as the request there of the round p of token
// g, through Call with the Set's gates for a lock request: after the
// Client's own releases that p follows (Follow), and with node i's
// not-after bound for the token's key (Set.NotAfter), which fn passes on
// to its script. The bound is kept in p, and fn gets a pointer to it, so
// that the script's arguments box it once.
func Request[T any](ctx context.Context, g *Token, p *Pending, i int, fn func(ctx context.Context, s redis.Scripter, notAfter *int64) (T, error)) (T, error) {
	awaitReleases(ctx, p.before, i) // our own releases there land first (Follow)
	return Call(ctx, g.set, i, true, g.timeout, func(ctx context.Context, s redis.Scripter) (T, error) {
		b, err := g.set.NotAfter(ctx, i, g.keys[i].Lock)
		if err != nil {
			var zero T
			return zero, err
		}
		p.bounds[i] = b
		return fn(ctx, s, &p.bounds[i])
	})
}

// Attach gives p its requests.
func (p *Pending) Attach(r Inflight) {
	p.r = r
	p.sent.Store(true) // publishes r (sync/atomic orders the write before it)
}

// round returns the attached round, or nil before Attach.
func (p *Pending) round() Inflight {
	if !p.sent.Load() {
		return nil
	}
	return p.r
}

// Answered reports whether node i has answered p's round.
func (p *Pending) Answered(i int) bool {
	r := p.round()
	return r != nil && r.Answered(i)
}

// Settled reports whether every node has answered p's round or given up.
func (p *Pending) Settled() bool {
	r := p.round()
	return r != nil && r.Settled()
}

// Send sends the registered round p of t to every node, from the start
// fixed at registration: its requests' deadline is p.Start plus timeout,
// or ctx's earlier deadline, however late this goroutine runs
// (quorum.StartAt).
func Send[T any](ctx context.Context, t *Token, p *Pending, timeout time.Duration, sp quorum.Spawner, fn func(ctx context.Context, i int) (T, error)) *quorum.Round[T] {
	r := quorum.StartAt(ctx, p.Start, t.n, timeout, sp, fn)
	p.Attach(RoundOf(r))
	return r
}

// RoundOf is a round as the ledger sees it.
func RoundOf[T any](r *quorum.Round[T]) Inflight { return round[T]{r} }

type round[T any] struct{ r *quorum.Round[T] }

func (p round[T]) Answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && Answered(rep.Err)
}

func (p round[T]) Settled() bool { return p.r.Settled() }

func (p round[T]) waitUntil(deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for i := range p.r.N() {
		select {
		case <-p.r.Done(i):
		case <-t.C:
			return
		}
	}
}

// Track records a round until all its requests have answered or given up;
// a node that gave up on one is remembered as unsure for good (its request
// may land at any later time).
func (g *Token) Track(r Inflight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	keep := g.rounds[:0]
	for _, old := range g.rounds {
		if !old.Settled() {
			keep = append(keep, old)
			continue
		}
		for i := range g.n {
			if !old.Answered(i) {
				g.markUnsureLocked(i)
			}
		}
	}
	clear(g.rounds[len(keep):])
	g.rounds = append(keep, r)
}

func (g *Token) markUnsureLocked(i int) {
	if g.unsure == nil {
		g.unsure = make([]bool, g.n)
	}
	g.unsure[i] = true
}

// unanswered reports whether a request of the token may still land on node
// i: one went unanswered there, or a registered round has not had node i's
// answer yet (or was not sent yet).
func (g *Token) unanswered(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unsure != nil && g.unsure[i] {
		return true
	}
	for _, r := range g.rounds {
		if !r.Answered(i) {
			return true
		}
	}
	return false
}

// waitSent waits until every registered round has been sent and has
// settled, or has passed its deadline (its start plus timeout). Rounds
// registered from now on are not waited for.
func (g *Token) waitSent(timeout time.Duration) {
	g.mu.Lock()
	rounds := append([]Inflight(nil), g.rounds...)
	g.mu.Unlock()
	for _, r := range rounds {
		p, ok := r.(*Pending)
		if !ok {
			continue
		}
		deadline := p.Start.Add(timeout)
		// Its sender attaches it without blocking: wait for that, but
		// never past the round's deadline (a sender that never sends
		// sends nothing that can land).
		for p.round() == nil && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if w, ok := p.round().(interface{ waitUntil(time.Time) }); ok {
			w.waitUntil(deadline)
		}
	}
}

// Guard returns how long node i must refuse requests of the token after
// its release: 0 when every request of the token there has been answered
// (none can land later), else the guard's lifetime (see GuardTTL).
func (g *Token) Guard(i int) time.Duration {
	if g.unanswered(i) {
		return g.GuardTTL()
	}
	return 0
}

// GuardTTL is how long a release's guard stays: until no request of the
// token can land on a node with its not-after bound still ahead of the
// node's clock (Set.guardLifetime: about a node timeout plus the clock
// estimates' error; twice the TTL for a node that was sent a request
// without a bound). A request that lands later is refused by its bound,
// however late. The guard is a key of its own, so it keeps nobody else
// waiting.
func (g *Token) GuardTTL() time.Duration {
	if testhooks.SkipReleaseGuard.Load() {
		return 0 // a negative control of the chaos checker
	}
	return g.set.guardLifetime(g.keys, g.ttl, g.timeout)
}

// WaitOut waits until no request of the token can land on any node any
// more: every registered round has been sent and has settled, or passed
// its deadline, and, where a request went unanswered, for as long as the
// release's guard would stay (Guard), by which time the node's clock has
// passed its not-after bound. A handover (Detach) calls it: the lock's
// next owner knows nothing of our requests, so they must be over before it
// is handed on. It takes at most about twice the node timeout plus the
// clock estimates' error; nothing when every request was answered.
func (g *Token) WaitOut() {
	if testhooks.DetachSkipsWait.Load() {
		return // a negative control: Detach before issue 30
	}
	g.waitSent(g.timeout)
	var d time.Duration
	for i := range g.n {
		d = max(d, g.Guard(i))
	}
	if d > 0 {
		time.Sleep(d)
	}
}
