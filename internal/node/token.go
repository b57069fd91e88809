package node

import (
	"context"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// Token is the node layer's unit: one lock token on the nodes of a Set,
// through which its rounds and its releases go (DESIGN step 4). It keeps,
// per node, whether a request of the token may still land there, and one
// rule, here and nowhere else: a round is registered — its start, hence
// its deadline and every request's not-after bound, fixed — before any
// point where it can be delayed (a goroutine switch, a queue, a retry).
// Register does that, under its owner's lock in one step with the check
// that the token may still send; Send sends the round from the start
// fixed there. So a round registered before a release has its deadline at
// most a node timeout after the release, however late its goroutine gets
// to send it, and the release's guard covers it (guard, release.go); a
// round that would come after the release is never registered, so never
// sent.
//
// A registered round counts as unanswered on every node until each node's
// request ends (ended): answered, or unsure for good when it may still
// land. Make one with Set.Token: a Token must know its nodes, or a node
// whose request went unanswered could be forgotten.
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

	mu     sync.Mutex    // protects open, unsure, idle, last
	open   []int         // per node (nil: none yet): requests of registered rounds not yet ended
	unsure []bool        // per node (nil: none): a request there ended unanswered
	idle   chan struct{} // made by a wait for every count of open to fall to 0, closed then (waitSent)
	last   time.Time     // the start of the latest registered round
}

// Token returns the node layer's unit for one lock token whose keys are
// keys (one per node), with the lock's TTL and node timeout, kept by own,
// which ends the token under mu; sp starts its requests.
func (s *Set) Token(keys []scripts.Keys, ttl, timeout time.Duration, mu *sync.Mutex, sp quorum.Spawner, own Owner) *Token {
	return &Token{n: len(s.Nodes), set: s, keys: keys, ttl: ttl, timeout: timeout, own: own, ownMu: mu, sp: sp}
}

// pendingRound is a registered round. Start is write-once, before the
// round is visible to anyone.
type pendingRound struct {
	Start time.Time
	t     *Token // whose registry counts its requests (nil: unregistered, runLate)
	// before are, per node, the Client's own releases of the token's keys
	// in flight when the round was registered, which its requests follow
	// (Op.Follow; nil: none).
	before [][]chan struct{}
	// bounds are, per node, the not-after bound its request carries
	// (Op.Bound), in small when there are few nodes.
	bounds []int64
	small  [5]int64
}
