package redlock

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// commitFence is phase 2 of a fenced acquire (step 8). t = max(counters
// read in phase 1) + 1; phase 1's granting majority is among the nodes
// read, and any earlier holder committed its token on a majority, which
// intersects it, so t exceeds every earlier token. Each node that granted is
// sent the commit as soon as its own phase-1 reply is in; the lock counts
// only if a majority commits.
func (c *Client) commitFence(ctx context.Context, l *Lock, r *quorum.Round[reply]) quorum.Tally {
	var top int64
	for i := range r.N() {
		if rep, ok := r.Reply(i); ok && rep.Err == nil {
			top = max(top, rep.Val.fence)
		}
	}
	l.fence = top + 1
	only := func(ctx context.Context, i int) (bool, error) {
		select {
		case <-r.Done(i):
		case <-ctx.Done():
			return false, ctx.Err()
		}
		rep, _ := r.Reply(i)
		return rep.Err == nil && rep.Val.ours, rep.Err // not granted: nothing to commit there
	}
	r2, _ := node.Run(ctx, l.tok, node.Op{Name: "commit", Only: only}, func(ctx context.Context, i int, s redis.Scripter, _ *int64) (reply, error) {
		ok, err := scripts.Commit(ctx, s, l.keys[i], l.token, l.fence)
		return reply{ours: ok}, err
	})
	return r2.Collect(ctx, classify, quorum.Majority)
}

// FencedSet is a write to a resource kept in Redis, protected by fencing
// tokens: it sets the field "value" of the hash key to value, atomically and
// only if token (a Lock's Fence()) is at least the highest token the key has
// seen; the token is then stored in the field "fence". A write with an older
// token returns ErrStaleFence and changes nothing.
//
// This is what makes a lock safe against a holder that was paused past its
// TTL: such a holder wakes up with an old token, and the resource itself
// refuses it. c is the Redis that holds the resource — any client, not
// necessarily one of the lock nodes.
func FencedSet(ctx context.Context, c redis.Scripter, key string, token int64, value string) error {
	if key == "" {
		return invalid("FencedSet: key must not be empty")
	}
	if token <= 0 {
		return invalid("FencedSet: token must be positive (a Lock acquired WithFencing(true)), got %d", token)
	}
	ok, err := scripts.FencedSet(ctx, c, key, token, value)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %d is older than the last token %q has seen", ErrStaleFence, token, key)
	}
	return nil
}
