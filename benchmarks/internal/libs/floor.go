package libs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// floor is the physical limit of one Redlock round without a library: a
// goroutine per node sends a plain SET key value NX PX ttl (DEL to release,
// PEXPIRE to extend), and the round ends when every node has answered. It
// checks no ownership and never retries: it is a yardstick, not a lock.
type floor struct {
	nodes []redis.UniversalClient
	ttl   time.Duration
}

func newFloor(nodes []redis.UniversalClient, ttl time.Duration) (Locker, error) {
	return &floor{nodes: nodes, ttl: ttl}, nil
}

// round runs fn on every node in parallel and waits for all of them. It
// returns how many nodes answered true.
func (f *floor) round(fn func(c redis.UniversalClient) (bool, error)) (int, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ok   int
		errs []error
	)
	for _, c := range f.nodes {
		wg.Go(func() {
			v, err := fn(c)
			mu.Lock()
			if v {
				ok++
			}
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return ok, errors.Join(errs...)
}

func (f *floor) Lock(ctx context.Context, resource string) (Held, error) {
	ok, err := f.round(func(c redis.UniversalClient) (bool, error) {
		return c.SetNX(ctx, resource, "floor", f.ttl).Result()
	})
	if err != nil || ok < len(f.nodes) {
		return nil, errors.Join(fmt.Errorf("%w: %d of %d nodes", ErrNotObtained, ok, len(f.nodes)), err)
	}
	return &floorHeld{f: f, key: resource}, nil
}

func (f *floor) Close() error { return nil }

type floorHeld struct {
	f   *floor
	key string
}

func (h *floorHeld) Extend(ctx context.Context) error {
	_, err := h.f.round(func(c redis.UniversalClient) (bool, error) {
		return c.PExpire(ctx, h.key, h.f.ttl).Result()
	})
	return err
}

func (h *floorHeld) Unlock(ctx context.Context) error {
	_, err := h.f.round(func(c redis.UniversalClient) (bool, error) {
		n, err := c.Del(ctx, h.key).Result()
		return n == 1, err
	})
	return err
}
