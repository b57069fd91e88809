package libs

import (
	"context"
	"errors"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// redislockLocker is bsm/redislock on one node. Its default is not to retry;
// to wait it is given the same jittered 50ms..250ms delay as the others.
type redislockLocker struct {
	c    *redislock.Client
	ttl  time.Duration
	opts *redislock.Options
}

func newRedislock(nodes []redis.UniversalClient, ttl time.Duration) (Locker, error) {
	if len(nodes) == 0 {
		return nil, errors.New("libs: redislock needs one node")
	}
	return redislockLocker{
		c:    redislock.New(nodes[0]),
		ttl:  ttl,
		opts: &redislock.Options{RetryStrategy: jitterStrategy{}},
	}, nil
}

// jitterStrategy is a redislock.RetryStrategy drawing each delay from
// [RetryMin, RetryMax). It is stateless, so one value serves every call.
type jitterStrategy struct{}

func (jitterStrategy) NextBackoff() time.Duration { return jitter() }

// Lock calls Obtain again when it gives up: without a ctx deadline Obtain
// stops after one TTL.
func (r redislockLocker) Lock(ctx context.Context, resource string) (Held, error) {
	for {
		l, err := r.c.Obtain(ctx, resource, r.ttl, r.opts)
		if err == nil {
			return &redislockHeld{l: l, ttl: r.ttl}, nil
		}
		if ctx.Err() != nil {
			return nil, errors.Join(err, ctx.Err())
		}
		if !errors.Is(err, redislock.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
	}
}

func (r redislockLocker) Close() error { return nil }

type redislockHeld struct {
	l   *redislock.Lock
	ttl time.Duration
}

func (h *redislockHeld) Extend(ctx context.Context) error { return h.l.Refresh(ctx, h.ttl, nil) }
func (h *redislockHeld) Unlock(ctx context.Context) error { return h.l.Release(ctx) }
