package libs

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

// quorumlock is used with its defaults (auto-renewal on, retry delay
// 50ms..250ms, drift 0.01, node timeout TTL/10) and the benchmark's TTL.
type quorumlock struct{ c *redlock.Client }

func newQuorumlock(nodes []redis.UniversalClient, ttl time.Duration) (Locker, error) {
	c, err := redlock.New(nodes, redlock.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	return quorumlock{c}, nil
}

// newQuorumlockPoll is quorumlock with the waiter queue off
// (WithWakeUp(false)): a refused Lock polls with its retry delay, as
// redsync's does, and never queues.
func newQuorumlockPoll(nodes []redis.UniversalClient, ttl time.Duration) (Locker, error) {
	c, err := redlock.New(nodes, redlock.WithTTL(ttl), redlock.WithWakeUp(false))
	if err != nil {
		return nil, err
	}
	return quorumlock{c}, nil
}

func (q quorumlock) Lock(ctx context.Context, resource string) (Held, error) {
	l, err := q.c.Lock(ctx, resource)
	if err != nil {
		return nil, err
	}
	return l, nil // *redlock.Lock has Extend and Unlock already
}

func (q quorumlock) Close() error { return q.c.Close() }

// Client returns the redlock Client, for the scenarios of quorumlock's own
// types (the semaphore scenarios of lockbench), which no other library has.
func (q quorumlock) Client() *redlock.Client { return q.c }
