package election

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

// owner starts the requests of one round on goroutines the redlock Client
// owns (node.Linked.Go), so that a straggler left behind by an early
// decision is waited for by the Client's Close, as the lock's own are.
type owner struct {
	goOwned func(timeout time.Duration, f func()) error
	timeout time.Duration
	closed  atomic.Bool // the Client refused a request: it is closed
}

// Go implements quorum.Spawner. Once the Client is closed, f runs on a
// goroutine of its own, where its request sees closed and returns at once,
// with no I/O.
func (o *owner) Go(f func()) {
	if !o.closed.Load() && o.goOwned(o.timeout, f) == nil {
		return
	}
	o.closed.Store(true)
	go f()
}

// start sends call to every node at once, each on a goroutine the redlock
// Client owns, and returns the round: the caller decides it with Collect as
// soon as the outcome is known — as the lock does (DESIGN step 2) — and the
// stragglers finish in the background, bounded by the node timeout. The
// node timeout is enforced by the fan-out itself (Collect stops waiting for
// a node then), not only through the request's ctx: a node client built
// without ContextTimeoutEnabled (go-redis's default) ignores ctx deadlines
// on reads, and would hold a step for its read timeout (3s by default).
//
// The requests do not end with ctx, only at the node timeout: go-redis
// closes the connection of a request cut short, and the lock may share the
// pool (see New). The caller stops waiting for them when ctx ends, by
// giving ctx to Collect.
func start[T any](e *Election, ctx context.Context, call func(ctx context.Context, i int, n redis.UniversalClient) (T, error)) *quorum.Round[T] {
	o := &owner{goOwned: e.link.Go, timeout: e.nodeTimeout}
	return quorum.Start(context.WithoutCancel(ctx), len(e.nodes), e.nodeTimeout, o, func(ctx context.Context, i int) (T, error) {
		if o.closed.Load() {
			var zero T
			return zero, redlock.ErrClosed
		}
		// Through the node layer (node.Do): the Client's gates for a node
		// down or stuck, its in-flight cap and identity check.
		gate, down := e.link.Set.Gate(i)
		return node.Do(ctx, e.layer[i], e.nodeTimeout, gate, down, func(ctx context.Context, _ redis.Scripter) (T, error) {
			return call(ctx, i, e.nodes[i])
		})
	})
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
