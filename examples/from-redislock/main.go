// Command from-redislock runs, on one embedded Redis node, the quorumlock
// equivalent of a bsm/redislock program, step by step; each step names the
// redislock call it replaces. One node is a Client over N=1 nodes (quorum
// 1): the same guarantees as redislock, plus the watchdog, wake-up and
// fencing. It exits non-zero if any step behaves otherwise than
// docs/migrating-from-redislock.md says.
//
//	go run ./examples/from-redislock
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "from-redislock:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true) // TTLs run in real time, as on Redis
	if err := m.Start(); err != nil {
		return err
	}
	defer m.Close()

	// redislock: client := redis.NewClient(&redis.Options{Addr: addr})
	//            locker := redislock.New(client)
	// WithKeyPrefix("") keeps redislock's key names (see step 6).
	locker, err := redlock.Dial(ctx, []string{"redis://" + m.Addr()}, redlock.WithKeyPrefix(""))
	if err != nil {
		return err
	}
	defer locker.Close()

	// 1. redislock: lock, err := locker.Obtain(ctx, "report", 500*time.Millisecond, nil)
	//    One attempt and a fixed lease: TryLock, WithAutoRenew(false).
	lock, err := locker.TryLock(ctx, "report", redlock.WithTTL(500*time.Millisecond), redlock.WithAutoRenew(false))
	if err != nil {
		return err
	}
	fmt.Println("1. obtained \"report\" for 500ms")

	// 2. redislock: a second Obtain -> redislock.ErrNotObtained
	if _, err := locker.TryLock(ctx, "report"); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 2: TryLock = %v; want ErrNotObtained", err)
	}
	fmt.Println("2. a second TryLock: ErrNotObtained (redislock: ErrNotObtained)")

	// 3. redislock: ttl, err := lock.TTL(ctx) -> local, no I/O
	fmt.Printf("3. remaining validity %v (redislock: lock.TTL, but without a round trip)\n",
		time.Until(lock.ValidUntil()).Round(100*time.Millisecond))

	// 4. redislock: err := lock.Refresh(ctx, 500*time.Millisecond, nil)
	//    Extend re-arms the lock's own TTL.
	if err := lock.Extend(ctx); err != nil {
		return fmt.Errorf("step 4: Extend = %v", err)
	}
	fmt.Println("4. Extend: nil (redislock: Refresh)")

	// 5. redislock: err := lock.Release(ctx); again -> redislock.ErrLockNotHeld
	if err := lock.Unlock(ctx); err != nil {
		return fmt.Errorf("step 5: Unlock = %v", err)
	}
	if err := lock.Unlock(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		return fmt.Errorf("step 5: second Unlock = %v; want ErrNotHeld", err)
	}
	fmt.Println("5. Unlock: nil; again: ErrNotHeld (redislock: ErrLockNotHeld)")

	// 6. Rolling migration: with WithKeyPrefix(""), a key that redislock set
	//    (its token, with a PX TTL) blocks us, and ours blocks redislock's
	//    MSETNX, so old and new processes exclude each other while both run.
	m.Set("report", "token-of-a-redislock-lock")
	m.SetTTL("report", 300*time.Millisecond)
	if _, err := locker.TryLock(ctx, "report"); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 6: TryLock over a redislock key = %v; want ErrNotObtained", err)
	}
	// 7. redislock: &redislock.Options{RetryStrategy: redislock.LimitRetry(redislock.LinearBackoff(100*time.Millisecond), 5)}
	//    5 retries = 6 attempts, 100ms apart. A waiter is also woken by a
	//    release, so the delay is a fallback (redislock polls).
	wait, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	lock, err = locker.Lock(wait, "report", redlock.WithRetryCount(6), redlock.WithRetryDelay(100*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("step 7: Lock with retries = %v", err)
	}
	fmt.Println("6. a redislock-held key refuses us;\n7. retrying every 100ms, we get it once that key expired")

	// 8. No redislock equivalent: the watchdog, on by default, keeps the
	//    lock past its TTL while it is held; Lost and Context report a loss.
	held, err := locker.Lock(ctx, "nightly", redlock.WithTTL(300*time.Millisecond))
	if err != nil {
		return err
	}
	time.Sleep(700 * time.Millisecond)
	if !held.Valid() {
		return errors.New("step 8: lock with the watchdog not valid after 2 TTLs")
	}
	fmt.Println("8. with the watchdog, \"nightly\" is still held after 2 TTLs")
	held.Unlock(ctx)
	lock.Unlock(ctx)
	return nil
}
