package redlock

import (
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
)

// This file holds what packages built on a Client (package election, the
// qlock command) need of it beyond locks: its node layer (node.Linked), so
// that they cannot be given other nodes, their requests pass the same gates
// and time out where the lock's do, and Close waits for them as for its
// own. They reach it with node.LinkOf(client, opts...), through the
// node.Access the Client embeds as access: the field's name is unexported,
// so the Client exports nothing for them.

// access is the node.Access a Client embeds (made in New).
type access = node.Access[Option]

// lockTimeout returns the node timeout of a lock this Client takes with
// the per-call options opts (the value of WithNodeTimeout, or by default a
// tenth of the effective TTL, at most MaxNodeTimeout): what the requests
// of a package built on the Client (node.LinkOf) time out by default. It
// returns an error matching ErrInvalidArgument when opts are not valid per
// call (Lock would refuse them too), ErrClosed never.
func (c *Client) lockTimeout(opts []Option) (time.Duration, error) {
	cfg, err := buildConfig(c.cfg, opts, true)
	if err != nil {
		return 0, err
	}
	return cfg.nodeTimeout, nil
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
