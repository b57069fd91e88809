package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
)

// runRWLock is the rwlock scenario (issue 24): -clients goroutines on
// -resources resources, readers and writers 9:1 (goroutine g is a writer
// when g%10 == 0), each acquiring, holding -hold and releasing; a sample
// is the wait in RLock or WLock. Only libraries with read-write locks
// (libs.RWLocker) take part.
func runRWLock(ctx context.Context, e *env, lk libs.Locker, res string, r *recorder) error {
	rw, ok := lk.(libs.RWLocker)
	if !ok {
		return errors.New("the rwlock scenario needs a library with read-write locks")
	}
	hard := hardCtx(ctx)
	nres := max(1, min(e.resources, e.clients))
	var (
		mu   sync.Mutex // protects fair
		fair Fairness
		wg   sync.WaitGroup
	)
	for g := range e.clients {
		name := fmt.Sprintf("%s:%d", res, g%nres)
		acquire := rw.RLock
		if g%10 == 0 {
			acquire = rw.WLock
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				h, err := acquire(hard, name)
				wait := time.Since(start)
				mu.Lock()
				if wait > fair.LongestWait {
					fair.LongestWait, fair.Censored = wait, err != nil
				}
				mu.Unlock()
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
				if err := h.Unlock(hard); err != nil && hard.Err() == nil {
					r.fail(err)
				}
			}
		})
	}
	wg.Wait()
	r.mu.Lock()
	r.fair = &fair
	r.mu.Unlock()
	return nil
}
