package redlock

import (
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
)

// This file holds what packages built on a Client (package election, the
// qlock command) need of it beyond locks: its nodes, so that they cannot be
// given others and their requests pass the same gates; an owner for their
// requests, so that Close waits for those as for its own; and the node
// timeout its locks use, so that their own requests time out where the
// lock's do.

// Link returns the Client's node layer to a package of this module built
// on it (package election, the qlock command): its nodes, an owner for
// their requests (Close waits for them), and the node timeout of a lock
// this Client takes with the per-call options opts (the value of
// WithNodeTimeout, or by default a tenth of the effective TTL, at most
// MaxNodeTimeout). Its first argument is of a type internal to this
// module, so no other package can call it. It does no I/O.
//
// It returns an error matching ErrInvalidArgument when opts are not valid
// per call (Lock would refuse them too), ErrClosed never.
func (c *Client) Link(_ node.Key, opts ...Option) (node.Linked, error) {
	cfg, err := buildConfig(c.cfg, opts, true)
	if err != nil {
		return node.Linked{}, err
	}
	return node.Linked{Set: c.set, Go: c.goOwned, NodeTimeout: cfg.timeout()}, nil
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
