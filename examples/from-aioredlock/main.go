// Command from-aioredlock runs, on 3 embedded Redis nodes, the quorumlock
// equivalent of an aioredlock (Python) program, step by step; each step
// names the aioredlock call it replaces. It exits non-zero if any step
// behaves otherwise than docs/migrating-from-aioredlock.md says.
//
//	go run ./examples/from-aioredlock
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "from-aioredlock:", err)
		os.Exit(1)
	}
}

func run() error {
	redis.SetLogger(quiet{})
	ctx := context.Background()
	var ms []*miniredis.Miniredis
	var urls []string
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	for range 3 {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			return err
		}
		ms = append(ms, m)
		urls = append(urls, "redis://"+m.Addr())
	}

	// aioredlock: lock_manager = Aioredlock(redis_instances, retry_count=3,
	//                 retry_delay_min=0.1, retry_delay_max=0.3, internal_lock_timeout=10)
	// (a 600ms TTL here, so the example is quick; seconds become durations)
	lockManager, err := redlock.Dial(ctx, urls, redlock.WithRetryCount(3),
		redlock.WithRetryDelay(100*time.Millisecond, 300*time.Millisecond), redlock.WithTTL(600*time.Millisecond))
	if err != nil {
		return err
	}
	// aioredlock: await lock_manager.destroy() -> Close (step 6)
	defer lockManager.Close()
	observer, err := redlock.Dial(ctx, urls)
	if err != nil {
		return err
	}
	defer observer.Close()

	// 1. aioredlock: lock = await lock_manager.lock("resource")
	//    lock_timeout=None: aioredlock extends the lock in the background;
	//    so does the watchdog, on by default (every TTL/3).
	lock, err := lockManager.Lock(ctx, "resource")
	if err != nil {
		return err
	}
	time.Sleep(1300 * time.Millisecond) // more than 2 TTLs
	// aioredlock: lock.valid, await lock_manager.is_locked("resource")
	locked, err := observer.IsLocked(ctx, "resource")
	if !lock.Valid() || !locked || err != nil {
		return fmt.Errorf("step 1: after 2 TTLs Valid() = %v, IsLocked = %v, %v; want true, true", lock.Valid(), locked, err)
	}
	fmt.Println("1. Lock with the watchdog: valid and IsLocked after 2 TTLs (aioredlock: lock_timeout=None)")

	// 2. aioredlock: await lock_manager.lock("resource") again -> LockError
	//    after retry_count attempts.
	if _, err := observer.Lock(ctx, "resource", redlock.WithRetryCount(3)); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 2: Lock = %v; want ErrNotObtained", err)
	}
	fmt.Println("2. another client, 3 attempts: ErrNotObtained (aioredlock: LockError)")

	// 3. aioredlock: await lock_manager.unlock(lock); lock.valid is False
	if err := lock.Unlock(ctx); err != nil || lock.Valid() {
		return fmt.Errorf("step 3: Unlock = %v, Valid() = %v", err, lock.Valid())
	}
	fmt.Println("3. Unlock: nil; Valid() = false")

	// 4. aioredlock: lock = await lock_manager.lock("report", lock_timeout=1)
	//                await lock_manager.extend(lock)
	//    A fixed lease: WithTTL and WithAutoRenew(false); Extend re-arms it.
	fixed, err := lockManager.Lock(ctx, "report", redlock.WithTTL(time.Second), redlock.WithAutoRenew(false))
	if err != nil {
		return err
	}
	if err := fixed.Extend(ctx); err != nil {
		return fmt.Errorf("step 4: Extend = %v", err)
	}
	fmt.Println("4. fixed 1s lease, Extend: nil (aioredlock: lock_timeout=1, extend)")

	// 5. aioredlock: async with await lock_manager.lock("job") as lock: ...
	//    Do locks, runs the function, and unlocks, also on error.
	err = lockManager.Do(ctx, "job", func(ctx context.Context) error {
		if ok, _ := observer.IsLocked(ctx, "job"); !ok {
			return errors.New("not locked inside Do")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("step 5: Do = %v", err)
	}
	fmt.Println("5. Do(\"job\", fn): locked while fn runs, released after (aioredlock: async with)")

	// 6. Where aioredlock's background extension only logs a failure, a lost
	//    lock is reported: Lost() closes, Context() is cancelled, OnLost runs.
	var onLost atomic.Bool
	doomed, err := lockManager.Lock(ctx, "doomed", redlock.WithOnLost(func(*redlock.Lock, error) { onLost.Store(true) }))
	if err != nil {
		return err
	}
	ms[0].SetError("ERR simulated failure")
	ms[1].SetError("ERR simulated failure")
	select {
	case <-doomed.Lost():
	case <-time.After(2 * time.Second):
		return errors.New("step 6: loss not reported within 2s")
	}
	ms[0].SetError("")
	ms[1].SetError("")
	cause := context.Cause(doomed.Context())
	fmt.Printf("6. 2 of 3 nodes fail: lost (Context cause matches ErrLockLost: %v)\n", errors.Is(cause, redlock.ErrLockLost))

	// 7. aioredlock: await lock_manager.destroy() releases the locks still
	//    held and closes the connections: Close does both.
	if err := lockManager.Close(); err != nil {
		return fmt.Errorf("step 7: Close = %v", err)
	}
	locked, err = observer.IsLocked(ctx, "report")
	if locked || err != nil {
		return fmt.Errorf("step 7: IsLocked after Close = %v, %v; want false", locked, err)
	}
	if !onLost.Load() { // Close waited for the OnLost goroutine
		return errors.New("step 6: OnLost was not called")
	}
	fmt.Println("7. Close released \"report\", still held (aioredlock: destroy)")

	// 8. Rolling migration: aioredlock uses the bare resource name as the
	//    key. A key it set (here on 2 of the 3 nodes) is invisible to a
	//    client with the default "lock:" prefix, and blocks one built with
	//    WithKeyPrefix(""), until it expires.
	for _, m := range ms[:2] {
		m.Set("invoice:42", "id-of-an-aioredlock-lock")
		m.SetTTL("invoice:42", 400*time.Millisecond)
	}
	if locked, err := observer.IsLocked(ctx, "invoice:42"); locked || err != nil {
		return fmt.Errorf("step 8: IsLocked with the default prefix = %v, %v; want false (another key)", locked, err)
	}
	rolling, err := redlock.Dial(ctx, urls, redlock.WithKeyPrefix(""))
	if err != nil {
		return err
	}
	defer rolling.Close()
	if _, err := rolling.TryLock(ctx, "invoice:42"); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 8: TryLock over an aioredlock key = %v; want ErrNotObtained", err)
	}
	wait, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	l8, err := rolling.Lock(wait, "invoice:42", redlock.WithRetryDelay(50*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("step 8: Lock once the aioredlock key expired = %v", err)
	}
	if err := l8.Unlock(ctx); err != nil {
		return fmt.Errorf("step 8: Unlock = %v", err)
	}
	fmt.Println("8. WithKeyPrefix(\"\"): an aioredlock-held key refuses us until it expires (the default prefix would not see it)")

	// 9. aioredlock: await lock_manager.get_active_locks() -> Held(): the
	//    locks this Client holds now.
	//    aioredlock: await lock_manager.get_lock(resource, lock_identifier)
	//    -> Resume(ctx, resource, token), once the holder let go of the
	//    lock with Detach (here another Client; it may be another process).
	batch, err := observer.Lock(ctx, "batch")
	if err != nil {
		return err
	}
	if held := observer.Held(); len(held) != 1 || held[0] != batch {
		return fmt.Errorf("step 9: Held() = %v; want the lock on \"batch\"", held)
	}
	resource, token := batch.Resource(), batch.Token()
	if err := batch.Detach(); err != nil {
		return fmt.Errorf("step 9: Detach = %v", err)
	}
	worker, err := redlock.Dial(ctx, urls)
	if err != nil {
		return err
	}
	defer worker.Close()
	resumed, err := worker.Resume(ctx, resource, token)
	if err != nil {
		return fmt.Errorf("step 9: Resume = %v", err)
	}
	if len(observer.Held()) != 0 || len(worker.Held()) != 1 || !resumed.Valid() {
		return fmt.Errorf("step 9: after Resume, Held() = %v and %v, Valid() = %v; want none, the resumed lock, true", observer.Held(), worker.Held(), resumed.Valid())
	}
	if err := resumed.Unlock(ctx); err != nil {
		return fmt.Errorf("step 9: Unlock of the resumed lock = %v", err)
	}
	fmt.Println("9. Held() lists a Client's locks (aioredlock: get_active_locks); Detach, then Resume(resource, token) elsewhere takes a lock over (aioredlock: get_lock)")
	return nil
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
