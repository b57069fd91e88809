// Package holder writes the identity of a lock's holder beside its lock
// key on every node, and withdraws it, through the redlock Client's node
// layer: an election's leader (package election) and a qlock permit's
// holder (cmd/qlock). Both go through one type, so that what makes such a
// write safe lives in one place: every write carries its node's not-after
// bound and lands only while the lock key holds the holding's token
// (scripts.Proclaim), and the withdraw is a release of the holding's
// node-layer token, whose mark outlasts every write still able to land
// (scripts.Withdraw with the guard the node layer sizes).
package holder

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// Suffix ends the key that holds a holder's identity: the lock key plus
// Suffix (package election exports it as LeaderSuffix).
const Suffix = ":leader"

// Nodes is one lock key per node of a Client and a node-layer token for
// the requests about it. It is safe for concurrent use.
type Nodes struct {
	tok     *node.Token
	name    string // what the requests are for, as a failed one reports it
	clients []redis.UniversalClient
	keys    []string // the lock key, per node
	own     owner
}

// New returns the nodes of link, for name's requests, for the lock keys keys (one per node, as
// redlock names them), sending over clients (clients of link's nodes, in
// the same order). Each request is bounded by timeout (0: the node timeout
// of the linked Client's locks) and runs on a goroutine the Client owns,
// so that its Close waits for it (node.Linked.Token).
func New(link node.Linked, name string, clients []redis.UniversalClient, keys []string, timeout time.Duration) *Nodes {
	n := &Nodes{name: name, clients: clients, keys: keys}
	sk := make([]scripts.Keys, len(keys))
	for i, k := range keys {
		sk[i] = scripts.Keys{Lock: k} // the clock of its master bounds a write (Cluster)
	}
	n.tok = link.Token(sk, timeout, clients, &n.own.mu, &n.own)
	return n
}

// Key is the identity key on node i.
func (n *Nodes) Key(i int) string { return n.keys[i] + Suffix }

// owner is a Nodes as the owner of its token (node.Owner): its rounds need
// nothing held, and a failed request's error is kept as it is (the caller
// wraps it).
type owner struct {
	mu sync.Mutex // registers the rounds (node.Linked.Token)
}

func (o *owner) Open() bool                                               { return true }
func (o *owner) Usable() error                                            { return nil }
func (o *owner) Fail(_ context.Context, _ int, _ string, err error) error { return err }

// Start sends call to every node at once, each on a goroutine the redlock
// Client owns, as a round of n's token (node.Run: the Client's gates for a
// node down or stuck, its in-flight cap and identity check), and returns
// the round: the caller decides it with Collect as soon as the outcome is
// known — as the lock does (DESIGN step 2) — and the stragglers finish in
// the background, bounded by the node timeout. The node timeout is
// enforced by the fan-out itself (Collect stops waiting for a node then),
// not only through the request's ctx: a node client built without
// ContextTimeoutEnabled (go-redis's default) ignores ctx deadlines on
// reads, and would hold a step for its read timeout (3s by default). With
// bound, each request carries its node's not-after bound (notAfter, else
// 0), which a write passes to its script.
//
// The requests do not end with ctx, only at the node timeout: go-redis
// closes the connection of a request cut short, and the lock may share the
// pool. The caller stops waiting for them when ctx ends, by giving ctx to
// Collect.
func Start[T any](n *Nodes, ctx context.Context, bound bool, call func(ctx context.Context, i int, c redis.UniversalClient, notAfter int64) (T, error)) *quorum.Round[T] {
	op := node.Op{Name: n.name, Bound: bound}
	r, _ := node.Run(context.WithoutCancel(ctx), n.tok, op, func(ctx context.Context, i int, _ redis.Scripter, notAfter *int64) (T, error) {
		var b int64
		if notAfter != nil {
			b = *notAfter
		}
		return call(ctx, i, n.clients[i], b)
	})
	return r
}

// Proclaim writes value, the identity of the holding term, on every node
// where the lock key holds token (scripts.Proclaim, with the lock key's
// remaining TTL), and returns once a majority wrote it or cannot, or ctx
// ended. Each write carries its node's not-after bound: one that reaches
// a node after the caller stopped waiting for it writes nothing there,
// withdrawn or not.
func (n *Nodes) Proclaim(ctx context.Context, token, value, term string) quorum.Tally {
	r := Start(n, ctx, true, func(ctx context.Context, i int, c redis.UniversalClient, notAfter int64) (bool, error) {
		return scripts.Proclaim(ctx, c, n.keys[i], n.Key(i), term, token, value, notAfter)
	})
	return r.Collect(ctx, func(_ int, rep quorum.Reply[bool]) (quorum.Vote, error) {
		switch {
		case rep.Err != nil:
			return quorum.Failed, rep.Err
		case rep.Val:
			return quorum.Yes, nil
		}
		return quorum.No, nil
	}, quorum.Majority)
}

// Withdraw ends term on every node, as a release of n's token
// (node.Release): it marks the term withdrawn, so that none of its
// identity writes (Proclaim) still in flight — a round's stragglers — can
// write value again there, and deletes the identity key where it still
// holds value, on a detached ctx bounded by the node timeout. It returns
// once until says the round is decided: with quorum.Majority, once a
// majority has answered (or cannot) — then no majority read can return
// value any more, nor ever will, and a node that answers later is left to
// finish in the background; with quorum.All, once every node answered or
// timed out — then no write of the term sent afterwards lands anywhere.
// Where the delete does not land, the identity expires with the lock.
//
// The mark lasts the lock key's remaining TTL there, and at least the
// guard the node layer sizes for the token's writes that may still land
// there: each carries its not-after bound (Proclaim), so past the mark no
// write of the term can land at all.
func (n *Nodes) Withdraw(ctx context.Context, value, term string, until quorum.Decider) quorum.Tally {
	ctx = context.WithoutCancel(ctx)
	r := node.Release(ctx, n.tok, nil, func(ctx context.Context, i int, s redis.Scripter, guard time.Duration) (bool, error) {
		// At least 1ms: PX takes no 0, when every write there was answered.
		return true, scripts.Withdraw(ctx, s, n.keys[i], n.Key(i), term, value, max(guard, time.Millisecond))
	}, nil)
	return r.Collect(ctx, Answered, until)
}

// Answered classifies a reply that only needs to arrive: any answer is a
// Yes, an error a failure.
func Answered[T any](_ int, rep quorum.Reply[T]) (quorum.Vote, error) {
	if rep.Err != nil {
		return quorum.Failed, rep.Err
	}
	return quorum.Yes, nil
}
