package redlock

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// This file holds what packages built on a Client (package election) need
// of it beyond locks: its nodes, so that they cannot be given others; the
// node timeout its locks use, so that their own requests time out where
// the lock's do; and an owner for their requests to the nodes, so that
// Close waits for those as it waits for its own.

// Nodes returns the Client's node clients, in the order given to New (or
// the URLs given to Dial): a new slice each call, of the clients the
// Client runs its requests on. Packages built on a Client (election) use
// them, so that they act on the very nodes its locks are on. Do not close
// them: New's caller, or Close for a Dial'ed Client, does. It does no I/O.
func (c *Client) Nodes() []redis.UniversalClient {
	out := make([]redis.UniversalClient, len(c.nodes))
	for i := range c.nodes {
		out[i] = c.nodes[i].C
	}
	return out
}

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

// Go runs f on a goroutine the Client owns, as it runs the stragglers of its
// own requests after an early decision: Close waits for f, for at most
// timeout (the longest time f may take: its node timeout) plus a short
// grace, or the Client's own node timeout if that is longer. Packages built
// on a Client use it for their requests to its nodes, so that one Close
// waits for everything the Client's users left in flight. f must return
// within timeout; Go does not enforce it.
//
// It returns ErrClosed, and does not run f, once Close has begun.
func (c *Client) Go(timeout time.Duration, f func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.maxWait = max(c.maxWait, timeout)
	c.wg.Go(f)
	return nil
}
