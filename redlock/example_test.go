package redlock_test

import (
	"context"
	"errors"
	"fmt"
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
	ctx2, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = client.Lock(ctx2, "report")
	fmt.Println("deadline:", errors.Is(err, context.DeadlineExceeded), errors.Is(err, redlock.ErrNotObtained))
	_ = holder.Unlock(ctx)
	// Output:
	// not obtained: true
	// deadline: true true
}
