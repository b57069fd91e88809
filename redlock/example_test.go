package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

// nodes starts n in-process Redis nodes whose TTLs run in real time, and
// returns a client for each and a function that stops them all.
func nodes(n int) ([]redis.UniversalClient, func()) {
	var clients []redis.UniversalClient
	var servers []*miniredis.Miniredis
	for range n {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			panic(err)
		}
		servers = append(servers, m)
		clients = append(clients, redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}))
	}
	return clients, func() {
		for i := range clients {
			clients[i].Close()
			servers[i].Close()
		}
	}
}

func Example() {
	nodes, stop := nodes(5)
	defer stop()

	client, err := redlock.New(nodes, redlock.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	ctx := context.Background()
	lock, err := client.Lock(ctx, "invoice:1234")
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", lock.Valid())

	// A second attempt, from this or any other client, is refused.
	_, err = client.TryLock(ctx, "invoice:1234")
	fmt.Println("second attempt:", errors.Is(err, redlock.ErrNotObtained))

	if err := lock.Unlock(ctx); err != nil {
		panic(err)
	}
	fmt.Println("held after unlock:", lock.Valid())
	// Output:
	// held: true
	// second attempt: true
	// held after unlock: false
}

func ExampleClient_Lock_retry() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()

	ctx := context.Background()
	holder, err := client.Lock(ctx, "report")
	if err != nil {
		panic(err)
	}
	// Three attempts, 10-20ms apart, then give up.
	_, err = client.Lock(ctx, "report", redlock.WithRetryCount(3), redlock.WithRetryDelay(10*time.Millisecond, 20*time.Millisecond))
	fmt.Println("not obtained:", errors.Is(err, redlock.ErrNotObtained))
	// Or bound the wait with ctx: the error then also matches ctx's error.
	// It matches ErrNotObtained if the nodes answered an attempt before ctx
	// ended (else ErrNoQuorum), so leave them time for one.
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = client.Lock(ctx2, "report")
	fmt.Println("deadline:", errors.Is(err, context.DeadlineExceeded), errors.Is(err, redlock.ErrNotObtained))
	_ = holder.Unlock(ctx)
	// Output:
	// not obtained: true
	// deadline: true true
}

// account is a resource that accepts a write only with a fencing token at
// least as high as any it has seen, so a holder that lost its lock without
// knowing (paused past its TTL) cannot overwrite a later holder's work.
type account struct {
	mu      sync.Mutex
	seen    int64
	balance int
}

func (a *account) set(fence int64, balance int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if fence < a.seen {
		return fmt.Errorf("stale token %d, already saw %d", fence, a.seen)
	}
	a.seen, a.balance = fence, balance
	return nil
}

func ExampleLock_Fence() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes, redlock.WithFencing(true))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx := context.Background()
	acct := &account{}

	first, _ := client.Lock(ctx, "account:7")
	_ = acct.set(first.Fence(), 100)
	_ = first.Unlock(ctx) // say it had expired while its holder was paused

	second, _ := client.Lock(ctx, "account:7")
	_ = acct.set(second.Fence(), 70)
	fmt.Println("tokens increase:", second.Fence() > first.Fence())

	// The first holder wakes up and writes with its old token: refused.
	fmt.Println("stale write:", acct.set(first.Fence(), 130) != nil, "balance:", acct.balance)
	_ = second.Unlock(ctx)
	// Output:
	// tokens increase: true
	// stale write: true balance: 70
}

func ExampleClient_Do() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()

	err = client.Do(context.Background(), "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost: long work checks it.
		fmt.Println("working under the lock")
		return nil
	}, redlock.WithTTL(5*time.Second))
	fmt.Println("err:", err)
	// Output:
	// working under the lock
	// err: <nil>
}

func ExampleLock_Context() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()

	lock, err := client.Lock(context.Background(), "job")
	if err != nil {
		panic(err)
	}
	// Hand lock.Context() to the work: it ends on loss, Unlock or Close,
	// and its cause says which.
	_ = lock.Unlock(context.Background())
	<-lock.Context().Done()
	fmt.Println(context.Cause(lock.Context()))
	// Output:
	// redlock: unlocked
}
