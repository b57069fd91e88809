package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/redlock"
)

// The semaphore scenarios run redlock.Semaphore, which only quorumlock has.
const (
	semPermits    = 4  // K
	semGoroutines = 16 // goroutines contending for the K permits
)

var (
	semaphoreScenario = scenario{
		name:       "semaphore",
		about:      fmt.Sprintf("%d goroutines Acquire+Unlock one of K=%d permits of a redlock.Semaphore (hold -hold); sample = wait in Acquire; ops/s = acquisitions/s", semGoroutines, semPermits),
		waits:      true,
		concurrent: true,
		only:       "quorumlock",
		run:        runSemaphore,
	}
	permitScenario = scenario{
		name:  "permit",
		about: fmt.Sprintf("TryAcquire+Unlock of a free permit of a K=%d redlock.Semaphore, one goroutine (compare with trylock)", semPermits),
		only:  "quorumlock",
		run:   runPermit,
	}
	trylockScenario = scenario{
		name:  "trylock",
		about: "TryLock+Unlock of a free resource, one goroutine: the mutex baseline of permit",
		only:  "quorumlock",
		run:   runTryLock,
	}
)

// client returns the redlock Client behind a quorumlock Locker.
func client(lk libs.Locker) (*redlock.Client, error) {
	q, ok := lk.(interface{ Client() *redlock.Client })
	if !ok {
		return nil, errors.New("this scenario needs quorumlock's Locker")
	}
	return q.Client(), nil
}

// semaphore returns the K-permit semaphore res of lk's Client.
func semaphore(lk libs.Locker, res string) (*redlock.Semaphore, error) {
	c, err := client(lk)
	if err != nil {
		return nil, err
	}
	return c.Semaphore(res, semPermits)
}

func runSemaphore(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	s, err := semaphore(lk, res)
	if err != nil {
		return err
	}
	hard := hardCtx(ctx)
	var wg sync.WaitGroup
	for g := range semGoroutines {
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				l, err := s.Acquire(hard)
				wait := time.Since(start)
				if err != nil {
					if hard.Err() == nil {
						r.fail(err)
					}
					return
				}
				r.add(g, wait)
				if e.hold > 0 {
					time.Sleep(e.hold)
				}
				if err := l.Unlock(context.WithoutCancel(hard)); err != nil {
					r.fail(err)
					return
				}
			}
		})
	}
	// No Fairness: the contenders table counts handoffs of one resource,
	// and a permit's next holder may come from any goroutine.
	wg.Wait()
	return nil
}

func runPermit(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	s, err := semaphore(lk, res)
	if err != nil {
		return err
	}
	return acquireRelease(ctx, r, s.TryAcquire)
}

func runTryLock(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	c, err := client(lk)
	if err != nil {
		return err
	}
	return acquireRelease(ctx, r, func(ctx context.Context, opts ...redlock.Option) (*redlock.Lock, error) {
		return c.TryLock(ctx, res, opts...)
	})
}

// acquireRelease records acquire + Unlock, one after another, until ctx
// ends.
func acquireRelease(ctx context.Context, r *recorder, acquire func(context.Context, ...redlock.Option) (*redlock.Lock, error)) error {
	hard := hardCtx(ctx)
	for ctx.Err() == nil {
		start := time.Now()
		l, err := acquire(hard)
		if err != nil {
			return err
		}
		if err := l.Unlock(hard); err != nil {
			return err
		}
		r.add(0, time.Since(start))
	}
	return nil
}
