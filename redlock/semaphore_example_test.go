package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// At most 2 of any number of workers, in any number of processes, run an
// export at once.
func ExampleClient_Semaphore() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes, redlock.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	exports, err := client.Semaphore("exports", 2)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	a, err := exports.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	b, err := exports.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("two permits:", a.Valid(), b.Valid(), exports.Permit(a) != exports.Permit(b))

	// A third is refused while both are held.
	_, err = exports.TryAcquire(ctx)
	fmt.Println("third:", errors.Is(err, redlock.ErrNotObtained))

	// A permit is a *Lock: renewed in the background, Lost and Context as
	// for any lock; Unlock gives it back.
	if err := a.Unlock(ctx); err != nil {
		panic(err)
	}
	c, err := exports.TryAcquire(ctx)
	fmt.Println("after a release:", err == nil)
	c.Unlock(ctx)
	b.Unlock(ctx)
	// Output:
	// two permits: true true true
	// third: true
	// after a release: true
}

// Semaphore.Do runs a function under one permit and gives it back.
func ExampleSemaphore_Do() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	sem, err := client.Semaphore("reports", 4)
	if err != nil {
		panic(err)
	}
	err = sem.Do(context.Background(), func(ctx context.Context) error {
		// ctx is cancelled if the permit is lost.
		fmt.Println("running under one of", sem.Permits(), "permits")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// running under one of 4 permits
	// err: <nil>
}

// WithMaxHold caps a lock's life: after d, renewal stops and the lock is
// lost with a cause that says so.
func ExampleWithMaxHold() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx := context.Background()
	lock, err := client.Lock(ctx, "report", redlock.WithMaxHold(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	<-lock.Lost()
	cause := context.Cause(lock.Context())
	fmt.Println("lost:", errors.Is(cause, redlock.ErrLockLost), "max hold:", errors.Is(cause, redlock.ErrMaxHold))
	lock.Unlock(ctx)
	// Output:
	// lost: true max hold: true
}
