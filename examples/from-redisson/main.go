// Command from-redisson runs, on 3 embedded Redis nodes, the quorumlock
// equivalent of a Redisson (Java) RLock program, step by step; each step
// names the Redisson call it replaces. The watchdog has Redisson's shape:
// a lease (lockWatchdogTimeout, 30s by default; 900ms here so the example
// is quick) renewed every third of it. It exits non-zero if any step
// behaves otherwise than docs/migrating-from-redisson.md says.
//
//	go run ./examples/from-redisson
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "from-redisson:", err)
		os.Exit(1)
	}
}

// renewals counts the watchdog's renewals.
type renewals struct {
	redlock.NoHooks
	n chan time.Time
}

func (r renewals) Extend(_ context.Context, i redlock.ExtendInfo) {
	if i.Renewal && i.Err == nil {
		select {
		case r.n <- time.Now():
		default:
		}
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

	// Redisson: Config config = new Config(); config.setLockWatchdogTimeout(900);
	//           RedissonClient redisson = Redisson.create(config);
	// Three independent nodes in one Client replace RedissonRedLock over
	// three RLocks.
	r := renewals{n: make(chan time.Time, 16)}
	redisson, err := redlock.Dial(ctx, urls, redlock.WithTTL(900*time.Millisecond), redlock.WithHooks(r))
	if err != nil {
		return err
	}
	defer redisson.Close()
	other, err := redlock.Dial(ctx, urls)
	if err != nil {
		return err
	}
	defer other.Close()

	// 1. Redisson: RLock lock = redisson.getLock("myLock"); lock.lock();
	//    The watchdog renews the lease every TTL/3, as Redisson's does.
	start := time.Now()
	lock, err := redisson.Lock(ctx, "myLock")
	if err != nil {
		return err
	}
	first := <-r.n
	second := <-r.n
	fmt.Printf("1. lock(): renewed after ~%v, then every ~%v (TTL 900ms / 3)\n",
		first.Sub(start).Round(100*time.Millisecond), second.Sub(first).Round(100*time.Millisecond))

	// 2. Redisson: lock.isLocked(); lock.isHeldByCurrentThread()
	//    Ownership is the *Lock value, not a thread: Valid reports it,
	//    locally; IsLocked asks the nodes whether anyone holds it.
	locked, err := other.IsLocked(ctx, "myLock")
	if !locked || err != nil || !lock.Valid() {
		return fmt.Errorf("step 2: IsLocked = %v, %v; Valid = %v", locked, err, lock.Valid())
	}
	fmt.Println("2. IsLocked: true; Valid: true (Redisson: isLocked, isHeldByCurrentThread)")

	// 3. Redisson: boolean ok = otherLock.tryLock();   -> false
	if _, err := other.TryLock(ctx, "myLock"); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 3: TryLock = %v; want ErrNotObtained", err)
	}
	fmt.Println("3. another client's TryLock: ErrNotObtained (Redisson: tryLock() == false)")

	// 4. Redisson: otherLock.tryLock(2, 1, TimeUnit.SECONDS) -- wait up to 2s,
	//    then hold a fixed 1s lease. The waiter is woken by the release
	//    (Redisson also waits on pub/sub).
	got := make(chan error, 1)
	go func() {
		wait, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		l, err := other.Lock(wait, "myLock", redlock.WithTTL(time.Second), redlock.WithAutoRenew(false))
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	// 5. Redisson: lock.unlock();
	if err := lock.Unlock(ctx); err != nil {
		return fmt.Errorf("step 5: Unlock = %v", err)
	}
	if err := <-got; err != nil {
		return fmt.Errorf("step 4: waiting Lock = %v", err)
	}
	fmt.Println("4. the waiter (tryLock(2, 1, SECONDS)) got it when")
	fmt.Println("5. unlock() released it")

	// 6. Redisson: RFencedLock fenced = redisson.getFencedLock("ledger");
	//              Long token = fenced.lockAndGetToken();
	var last int64
	for range 2 {
		l, err := redisson.Lock(ctx, "ledger", redlock.WithFencing(true))
		if err != nil {
			return err
		}
		if l.Fence() <= last {
			return fmt.Errorf("step 6: fence %d after %d", l.Fence(), last)
		}
		last = l.Fence()
		l.Unlock(ctx)
	}
	fmt.Printf("6. WithFencing(true): tokens increase across holders, last %d (Redisson: lockAndGetToken)\n", last)

	// 7. Redisson is reentrant per thread; quorumlock is not. Go has no
	//    thread identity: the caller is known by its ctx. A Lock whose ctx
	//    comes from the held lock (its Context, or Do's fn ctx) would wait
	//    for itself, and returns ErrAlreadyHeld at once; any other ctx is
	//    another caller (another goroutine of this process, say), which
	//    waits its turn, or with TryLock is refused. Pass the *Lock down
	//    instead of locking again.
	outer, err := redisson.Lock(ctx, "reentrant")
	if err != nil {
		return err
	}
	if _, err := redisson.Lock(outer.Context(), "reentrant"); !errors.Is(err, redlock.ErrAlreadyHeld) {
		return fmt.Errorf("step 7: Lock under the held lock's ctx = %v; want ErrAlreadyHeld", err)
	}
	if _, err := redisson.TryLock(ctx, "reentrant"); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 7: TryLock of a held resource = %v; want ErrNotObtained", err)
	}
	outer.Unlock(ctx)
	fmt.Println("7. locking again under the lock: ErrAlreadyHeld at once; with another ctx, TryLock: ErrNotObtained (not reentrant)")
	return nil
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
