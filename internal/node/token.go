package node

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
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
// to send it, and the release's guard covers it (guard, release.go); a round that
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
	ownMu        *sync.Mutex                      // the owner's: it ends the token under it
	sp           quorum.Spawner                   // starts the requests, on goroutines the Client owns
	via          []*Node                          // per node, the client its requests go on (nil: the Set's; see Linked.Token)
	closed       func(context.Context, int) error // a linked token's: its Client's error once closed (Linked.Token)

	mu     sync.Mutex  // protects rounds, unsure
	rounds []roundView // rounds with requests maybe still in flight
	unsure []bool      // per node (nil: none): a request there went unanswered
}

// Token returns the node layer's unit for one lock token whose keys are
// keys (one per node), with the lock's TTL and node timeout, kept by own,
// which ends the token under mu; sp starts its requests.
func (s *Set) Token(keys []scripts.Keys, ttl, timeout time.Duration, mu *sync.Mutex, sp quorum.Spawner, own Owner) *Token {
	return &Token{n: len(s.Nodes), set: s, keys: keys, ttl: ttl, timeout: timeout, own: own, ownMu: mu, sp: sp}
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

// round returns the attached round, or nil before Attach.
func (p *pendingRound) round() roundView {
	if !p.sent.Load() {
		return nil
	}
	return p.r
}

// round is a sent round as the registry sees it (roundOf).
type round[T any] struct{ r *quorum.Round[T] }

func (p round[T]) Answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && Answered(rep.Err)
}

func (p round[T]) Settled() bool { return p.r.Settled() }

// Answered reports whether node i has answered p's round.
func (p *pendingRound) Answered(i int) bool { return p.sent.Load() && p.r.Answered(i) }

// Settled reports whether every node has answered p's round or given up.
func (p *pendingRound) Settled() bool { return p.sent.Load() && p.r.Settled() }

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
