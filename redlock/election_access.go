package redlock

import (
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
)

// This file holds what packages built on a Client (package election, the
// qlock command) need of it beyond locks: its node layer (node.Linked), so
// that they cannot be given other nodes, their requests pass the same gates
// and time out where the lock's do, and Close waits for them as for its
// own.

// Link sets *link to the Client's node layer for a package of this module
// built on it (package election, the qlock command): its nodes, and the
// tokens of that package's requests (node.Linked.Token: Close waits for
// them), which time out where a lock this Client takes with the per-call
// options opts does (the value of WithNodeTimeout, or by default a tenth of
// the effective TTL, at most MaxNodeTimeout). link points to a type
// internal to this module, so no other package can pass anything but nil,
// for which it returns ErrInvalidArgument. It does no I/O.
//
// It returns an error matching ErrInvalidArgument when opts are not valid
// per call (Lock would refuse them too), ErrClosed never.
func (c *Client) Link(link *node.Linked, opts ...Option) error {
	if link == nil {
		return invalid("Link: link must not be nil")
	}
	cfg, err := buildConfig(c.cfg, opts, true)
	if err != nil {
		return err
	}
	*link = c.set.Link(cfg.nodeTimeout, c.goOwned)
	return nil
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
