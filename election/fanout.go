package election

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

// owner is an Election as the owner of its node-layer token (node.Owner):
// its rounds need nothing held, and a failed request's error is kept as
// it is (nodeErrors wraps it).
type owner struct {
	mu sync.Mutex // registers the rounds (node.Linked.Token)
}

func (o *owner) Open() bool    { return true }
func (o *owner) Usable() error { return nil }

// Fail keeps a request's error as it is: nodeErrors wraps it.
func (o *owner) Fail(_ context.Context, _ int, _ string, err error) error { return err }

// start sends call to every node at once, each on a goroutine the redlock
// Client owns, as a round of the election's token (node.Run: the Client's
// gates for a node down or stuck, its in-flight cap and identity check),
// and returns the round: the caller decides it with Collect as soon as the
// outcome is known — as the lock does (DESIGN step 2) — and the stragglers
// finish in the background, bounded by the node timeout. The node timeout
// is enforced by the fan-out itself (Collect stops waiting for a node
// then), not only through the request's ctx: a node client built without
// ContextTimeoutEnabled (go-redis's default) ignores ctx deadlines on
// reads, and would hold a step for its read timeout (3s by default). With
// bound, each request carries its node's not-after bound (notAfter, else
// 0), which a write passes to its script.
//
// The requests do not end with ctx, only at the node timeout: go-redis
// closes the connection of a request cut short, and the lock may share the
// pool (see New). The caller stops waiting for them when ctx ends, by
// giving ctx to Collect.
func start[T any](e *Election, ctx context.Context, bound bool, call func(ctx context.Context, i int, n redis.UniversalClient, notAfter int64) (T, error)) *quorum.Round[T] {
	op := node.Op{Name: "election", Bound: bound}
	r, _ := node.Run(context.WithoutCancel(ctx), e.tok, op, func(ctx context.Context, i int, _ redis.Scripter, notAfter *int64) (T, error) {
		var b int64
		if notAfter != nil {
			b = *notAfter
		}
		return call(ctx, i, e.nodes[i], b)
	})
	return r
}

// nodeErrors returns one *redlock.NodeError per failed node of t.
func (e *Election) nodeErrors(t quorum.Tally) []error {
	var errs []error
	for i, err := range t.Errs {
		if err == nil {
			continue
		}
		if ne := (*redlock.NodeError)(nil); !errors.As(err, &ne) {
			err = &redlock.NodeError{Node: i, Addr: nodeaddr.Of(e.nodes[i]), Err: err}
		}
		errs = append(errs, err)
	}
	return errs
}

// answered classifies a reply that only needs to arrive: any answer is a
// Yes, an error a failure.
func answered[T any](_ int, rep quorum.Reply[T]) (quorum.Vote, error) {
	if rep.Err != nil {
		return quorum.Failed, rep.Err
	}
	return quorum.Yes, nil
}
