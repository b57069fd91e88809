package libs

import (
	"context"
	"errors"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// redsyncLocker is redsync with its defaults (32 tries, 50ms..250ms jittered
// delay, drift 0.01, timeout factor 0.05) and the benchmark's TTL as expiry.
// One Mutex per acquisition, as redsync's README does.
type redsyncLocker struct {
	rs  *redsync.Redsync
	ttl time.Duration
}

func newRedsync(nodes []redis.UniversalClient, ttl time.Duration) (Locker, error) {
	pools := make([]redsyncredis.Pool, len(nodes))
	for i, n := range nodes {
		pools[i] = goredis.NewPool(n)
	}
	return redsyncLocker{rs: redsync.New(pools...), ttl: ttl}, nil
}

// Lock calls LockContext again when redsync gives up after its 32 tries, so
// that it waits until ctx is done like the others; the wait is measured
// across those calls.
func (r redsyncLocker) Lock(ctx context.Context, resource string) (Held, error) {
	m := r.rs.NewMutex(resource, redsync.WithExpiry(r.ttl))
	for {
		err := m.LockContext(ctx)
		if err == nil {
			return (*redsyncHeld)(m), nil
		}
		if ctx.Err() != nil {
			return nil, errors.Join(err, ctx.Err())
		}
		if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, new(*redsync.ErrTaken)) && !errors.As(err, new(redsync.ErrTaken)) {
			return nil, err
		}
	}
}

func (r redsyncLocker) Close() error { return nil }

// redsyncHeld is a locked *redsync.Mutex.
type redsyncHeld redsync.Mutex

var errNotExtended = errors.New("libs: redsync: not extended on a majority")

func (h *redsyncHeld) Extend(ctx context.Context) error {
	ok, err := (*redsync.Mutex)(h).ExtendContext(ctx)
	if err == nil && !ok {
		err = errNotExtended
	}
	return err
}

func (h *redsyncHeld) Unlock(ctx context.Context) error {
	ok, err := (*redsync.Mutex)(h).UnlockContext(ctx)
	if err == nil && !ok {
		err = errNotExtended
	}
	return err
}
