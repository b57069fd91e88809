// Command from-redsync runs, on 3 embedded Redis nodes, the quorumlock
// equivalent of a go-redsync/redsync program, step by step; each step names
// the redsync call it replaces. It exits non-zero if any step behaves
// otherwise than docs/migrating-from-redsync.md says.
//
//	go run ./examples/from-redsync
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
		fmt.Fprintln(os.Stderr, "from-redsync:", err)
		os.Exit(1)
	}
}

// nodes starts n embedded nodes whose TTLs run in real time.
func nodes(n int) ([]*miniredis.Miniredis, []string, error) {
	var ms []*miniredis.Miniredis
	var urls []string
	for range n {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			return ms, nil, err
		}
		ms = append(ms, m)
		urls = append(urls, "redis://"+m.Addr())
	}
	return ms, urls, nil
}

func run() error {
	redis.SetLogger(quiet{})
	ctx := context.Background()
	ms, urls, err := nodes(3)
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	if err != nil {
		return err
	}

	// redsync: rs := redsync.New(pool1, pool2, pool3)
	//          mutex := rs.NewMutex("order:1", redsync.WithExpiry(2*time.Second), redsync.WithTries(5))
	// One Client holds the nodes and the defaults; resources are named per
	// call. WithKeyPrefix("") keeps redsync's key names (see step 7).
	// WithAutoRenew(false) gives redsync's fixed lease; the watchdog is on by
	// default (step 6).
	c, err := redlock.Dial(ctx, urls, redlock.WithKeyPrefix(""),
		redlock.WithTTL(2*time.Second), redlock.WithRetryCount(5), redlock.WithAutoRenew(false))
	if err != nil {
		return err
	}
	defer c.Close()
	other, err := redlock.Dial(ctx, urls, redlock.WithKeyPrefix(""))
	if err != nil {
		return err
	}
	defer other.Close()

	// 1. redsync: err := mutex.LockContext(ctx)
	l, err := c.Lock(ctx, "order:1")
	if err != nil {
		return err
	}
	// redsync: mutex.Name(), mutex.Until()
	fmt.Printf("1. locked %q, valid for %v (redsync: Until)\n", l.Resource(), time.Until(l.ValidUntil()).Round(100*time.Millisecond))

	// 2. redsync: err := mutex2.TryLockContext(ctx) -> *redsync.ErrTaken
	_, err = other.TryLock(ctx, "order:1")
	if !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 2: TryLock = %v; want ErrNotObtained", err)
	}
	fmt.Println("2. another client's TryLock: ErrNotObtained (redsync: ErrTaken)")

	// 3. redsync: ok, err := mutex.ExtendContext(ctx) -> now a single error
	if err := l.Extend(ctx); err != nil {
		return fmt.Errorf("step 3: Extend = %v", err)
	}
	fmt.Println("3. Extend: nil (redsync: ExtendContext returned true)")

	// 4. redsync: ok, err := mutex.UnlockContext(ctx); a second unlock
	//    reports redsync.ErrLockAlreadyExpired.
	if err := l.Unlock(ctx); err != nil {
		return fmt.Errorf("step 4: Unlock = %v", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		return fmt.Errorf("step 4: second Unlock = %v; want ErrNotHeld", err)
	}
	fmt.Println("4. Unlock: nil; again: ErrNotHeld (redsync: ErrLockAlreadyExpired)")

	// 5. A fixed lease that ran out is never extended again: Extend reports
	//    the loss without I/O (redsync: ErrExtendFailed).
	l5, err := c.Lock(ctx, "order:5", redlock.WithTTL(300*time.Millisecond))
	if err != nil {
		return err
	}
	time.Sleep(350 * time.Millisecond)
	if err := l5.Extend(ctx); !errors.Is(err, redlock.ErrLockLost) {
		return fmt.Errorf("step 5: Extend after expiry = %v; want ErrLockLost", err)
	}
	fmt.Println("5. Extend after the lease ran out: ErrLockLost (redsync: ErrExtendFailed)")

	// 6. No redsync equivalent: the watchdog. The lease (300ms here) is
	//    renewed every TTL/3 while the lock is held.
	l6, err := c.Lock(ctx, "order:6", redlock.WithTTL(300*time.Millisecond), redlock.WithAutoRenew(true))
	if err != nil {
		return err
	}
	time.Sleep(700 * time.Millisecond)
	if !l6.Valid() {
		return errors.New("step 6: lock with the watchdog not valid after 2 TTLs")
	}
	fmt.Println("6. with WithAutoRenew(true), still valid after 2 TTLs")
	l6.Unlock(ctx)

	// 7. Rolling migration: with WithKeyPrefix(""), a key that redsync set
	//    (SET NX PX with its random value, here on 2 of the 3 nodes) blocks
	//    us, and ours blocks redsync's SET NX, so old and new processes
	//    exclude each other while both run.
	for _, m := range ms[:2] {
		m.Set("order:7", "value-of-a-redsync-mutex")
		m.SetTTL("order:7", 400*time.Millisecond)
	}
	if _, err := c.TryLock(ctx, "order:7"); !errors.Is(err, redlock.ErrNotObtained) {
		return fmt.Errorf("step 7: TryLock over a redsync key = %v; want ErrNotObtained", err)
	}
	wait, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	l7, err := c.Lock(wait, "order:7", redlock.WithRetryCount(0), redlock.WithRetryDelay(50*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("step 7: Lock once the redsync key expired = %v", err)
	}
	fmt.Println("7. a redsync-held key refuses us until it expires; then we get it")
	l7.Unlock(ctx)

	// 8. redsync: *redsync.RedisError{Node, Err} -> *redlock.NodeError{Node, Addr, Err}.
	//    Two of three nodes fail: ErrNoQuorum, with one NodeError per node.
	ms[0].SetError("ERR simulated failure")
	ms[1].SetError("ERR simulated failure")
	_, err = c.TryLock(ctx, "order:8")
	var ne *redlock.NodeError
	if !errors.Is(err, redlock.ErrNoQuorum) || !errors.As(err, &ne) {
		return fmt.Errorf("step 8: TryLock with 2 of 3 nodes failing = %v; want ErrNoQuorum with *NodeError", err)
	}
	ms[0].SetError("")
	ms[1].SetError("")
	fmt.Printf("8. 2 of 3 nodes failing: ErrNoQuorum; first node error: node %d: %v (redsync: RedisError)\n", ne.Node, ne.Err)
	return nil
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
