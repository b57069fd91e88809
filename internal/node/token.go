package node

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	own          Owner
	via          []*Node // per node, the client its requests go on (nil: the Set's; see Through)

	mu     sync.Mutex  // protects rounds, unsure
	rounds []roundView // rounds with requests maybe still in flight
	unsure []bool      // per node (nil: none): a request there went unanswered
}

// Token returns the node layer's unit for one lock token whose keys are
// keys (one per node), with the lock's TTL and node timeout, kept by own.
func (s *Set) Token(keys []scripts.Keys, ttl, timeout time.Duration, own Owner) *Token {
	return &Token{n: len(s.Nodes), set: s, keys: keys, ttl: ttl, timeout: timeout, own: own}
}

// roundView is a round of requests of one token, seen by its release: where
// a node has not answered it, a request may still land after the release.
type roundView interface {
	Answered(i int) bool // node i's reply is in, or its request provably never left (see Answered)
	Settled() bool       // every node has answered or given up
}

// pendingRound is a registered round: unanswered everywhere until Run gives it
// its requests (Attach). Start is write-once, before the round is visible
// to anyone.
type pendingRound struct {
	Start time.Time
	r     roundView   // written once by Attach, before attached is set
	sent  atomic.Bool // r is set
	// before are, per node, the Client's own releases of the token's keys
	// in flight when the round was registered, which its requests follow
	// (Op.Follow; nil: none).
	before [][]chan struct{}
	// bounds are, per node, the not-after bound its request carries
	// (Op.Bound), in small when there are few nodes.
	bounds []int64
	small  [5]int64
}

// register registers a round of the token that starts now, before
// anything of it is sent. With held, it does so under the owner's lock and
// only if the owner says the token may still send then (Owner.Open): the
// owner ends the token (a release, a handover) under that lock, so a
// release that comes later sees the round pending — every node
// unanswered, so it leaves the guard — and a round that would come after
// it is never registered; it then returns the owner's error (Usable).
// Without held (an acquire attempt, its fence commit and yields, Resume's
// rounds, Detach's leaving the queues: the lock is not handed out, and its
// release comes from the same goroutine after the round) it always
// registers.
func (g *Token) register(held bool) (*pendingRound, error) {
	for {
		g.own.Lock()
		if !held || g.own.Open() {
			p := g.newPending()
			g.track(p)
			g.own.Unlock()
			return p, nil
		}
		g.own.Unlock()
		if err := g.own.Usable(); err != nil {
			return nil, err
		}
	}
}

// newPending returns a round that starts now, not registered.
func (g *Token) newPending() *pendingRound {
	p := &pendingRound{Start: time.Now()}
	if g.n <= len(p.small) {
		p.bounds = p.small[:g.n]
	} else {
		p.bounds = make([]int64, g.n)
	}
	return p
}

// ReleaseBegin registers a release of the token on node i (Set.ReleaseBegin).
func (g *Token) ReleaseBegin(i int) (done func()) { return g.set.ReleaseBegin(g.keys[i], i) }

// Attach gives p its requests.
func (p *pendingRound) Attach(r roundView) {
	p.r = r
	p.sent.Store(true) // publishes r (sync/atomic orders the write before it)
}

// round returns the attached round, or nil before Attach.
func (p *pendingRound) round() roundView {
	if !p.sent.Load() {
		return nil
	}
	return p.r
}

// Answered reports whether node i has answered p's round.
func (p *pendingRound) Answered(i int) bool {
	r := p.round()
	return r != nil && r.Answered(i)
}

// Settled reports whether every node has answered p's round or given up.
func (p *pendingRound) Settled() bool {
	r := p.round()
	return r != nil && r.Settled()
}

// roundOf is a round as the ledger sees it.
func roundOf[T any](r *quorum.Round[T]) roundView { return round[T]{r} }

type round[T any] struct{ r *quorum.Round[T] }

func (p round[T]) Answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && Answered(rep.Err)
}

func (p round[T]) Settled() bool { return p.r.Settled() }

// track records a round until all its requests have answered or given up;
// a node that gave up on one is remembered as unsure for good (its request
// may land at any later time).
func (g *Token) track(r roundView) {
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

// The order of a Client's own requests to one key on one node: an acquire
// goes after this Client's releases of the key in flight there when its
// round was registered (Follow, Request), so that its own leftovers never
// refuse it.

// relKey names a lock key on one node; Set.releasing holds, per
// relKey, one channel per release of it in flight there, closed when that
// release ends.
type relKey struct {
	key  string // the lock key on the node
	node int
}

// ReleaseBegin registers a release of keys on node i (under each of its
// lock keys: a multi-lock's every resource), before it is handed to a
// goroutine or sent; done ends it. Every sender of a release registers
// it: Unlock's round, a refused call's cleanup and a lost call's abandon
// (package redlock's release.go), and the retry loop's pipelines
// (releaser.go). This Client's next acquire of any of those keys waits on each node for the
// releases registered there before its round was (Token.Follow), so
// that its own leftovers never refuse it: a TryLock right after a refused
// one found the first one's grant still there
// (TestReal_evenNNeedsThreeOfFour, once beside stress-ng).
func (s *Set) ReleaseBegin(keys scripts.Keys, i int) (done func()) {
	locks := keys.LockKeys()
	f := make(chan struct{}) // closed when the release has ended
	s.relMu.Lock()
	if s.releasing == nil {
		s.releasing = make(map[relKey][]chan struct{})
	}
	for _, key := range locks {
		k := relKey{key, i}
		s.releasing[k] = append(s.releasing[k], f)
	}
	s.relMu.Unlock()
	return func() {
		s.relMu.Lock()
		for _, key := range locks {
			k := relKey{key, i}
			fs := s.releasing[k]
			if j := slices.Index(fs, f); j >= 0 {
				fs = slices.Delete(fs, j, j+1)
			}
			if len(fs) == 0 {
				delete(s.releasing, k)
			} else {
				s.releasing[k] = fs
			}
		}
		s.relMu.Unlock()
		close(f)
	}
}

// releasesBefore returns, per node, this Client's releases of keys in
// flight now (nil: none anywhere). An acquire round takes it when it is
// registered, and each of its requests waits for those only
// (Request): a release registered later is never one it must
// follow, and may be its own call's cleanup, which waits for the
// request's answer — a request that started late waited for it, the two
// until the node timeout, and every acquire of the key on that node
// behind them (lockbench's semaphore: waits in steps of one node timeout;
// TestLate_lateRequestDoesNotWaitForItsOwnCleanup).
func (s *Set) releasesBefore(keys []scripts.Keys) [][]chan struct{} {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if len(s.releasing) == 0 {
		return nil
	}
	var out [][]chan struct{}
	for i, k := range keys {
		for _, key := range k.LockKeys() {
			if fs := s.releasing[relKey{key, i}]; len(fs) > 0 {
				if out == nil {
					out = make([][]chan struct{}, len(keys))
				}
				out[i] = append(out[i], fs...)
			}
		}
	}
	return out
}

// awaitReleases waits until the releases fs took for node i have ended
// (each within its node timeout), or ctx ends.
func awaitReleases(ctx context.Context, fs [][]chan struct{}, i int) {
	if fs == nil {
		return
	}
	for _, f := range fs[i] {
		select {
		case <-f:
		case <-ctx.Done():
			return
		}
	}
}
