package redlock

import (
	"context"
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
)

// This file holds what packages built on a Client (package election, the
// qlock command) need of it beyond locks: the node timeout its locks use,
// so that their own requests time out where the lock's do, and — through
// the node layer's Link, not exported here — its nodes, so that they cannot
// be given others and their requests pass the same gates, and an owner for
// their requests, so that Close waits for those as for its own.

// NodeTimeout returns the per-node request timeout of a lock this Client
// takes with the per-call options opts: the value of WithNodeTimeout, or by
// default a tenth of the effective TTL, at most MaxNodeTimeout. It does no
// I/O.
//
// It returns an error matching ErrInvalidArgument when opts are not valid
// per call (Lock would refuse them too), ErrClosed never.
func (c *Client) NodeTimeout(opts ...Option) (time.Duration, error) {
	cfg := buildConfig(c.cfg, opts)
	switch {
	case cfg.keyPrefixSet:
		return 0, invalid("WithKeyPrefix is valid for New only")
	case cfg.renewBatchSet:
		return 0, invalid("WithRenewBatch is valid for New only")
	}
	if err := cfg.validate(); err != nil {
		return 0, err
	}
	return cfg.timeout(), nil
}

func init() {
	node.Link = func(x any) node.Linked {
		c := x.(*Client)
		nodes := make([]*node.Node, len(c.nodes))
		for i := range c.nodes {
			nodes[i] = &c.nodes[i].Node
		}
		return node.Linked{Nodes: nodes, Gate: c.gate, Go: c.goOwned}
	}
}

// gate returns what node.Do needs for node i (see node.Linked).
func (c *Client) gate(i int) (func(context.Context) error, func()) {
	var g func(context.Context) error
	if !c.nodes[i].id.verified.Load() {
		g = func(ctx context.Context) error {
			if dup := c.duplicate(); dup != nil {
				return dup
			}
			return c.identify(ctx, i)
		}
	}
	return g, func() { c.probe(i) }
}

// goOwned runs f on a goroutine the Client owns, as it runs the stragglers
// of its own requests after an early decision: Close waits for f, for at
// most timeout (the longest time f may take: its node timeout) plus a
// short grace, or the Client's own node timeout if that is longer. f must
// return within timeout; goOwned does not enforce it. It returns
// ErrClosed, and does not run f, once Close has begun.
func (c *Client) goOwned(timeout time.Duration, f func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.maxWait = max(c.maxWait, timeout)
	c.wg.Go(f)
	return nil
}
