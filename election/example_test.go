package election_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
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
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes, redlock.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	e, err := election.New(client, "scheduler", election.WithIdentity("host-a"),
		election.WithLockOptions(redlock.WithFencing(true)))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	err = e.Run(ctx, func(ctx context.Context, t *election.Term) error {
		// The leader's work: ctx is cancelled the moment leadership is
		// lost. Attach t.Fence() to writes so that a deposed leader's
		// late writes can be refused.
		l, err := e.Leader(ctx)
		if err != nil {
			return err
		}
		fmt.Println("leader:", l.Identity, "fence:", t.Fence())
		return nil // done: Run resigns and returns
	})
	fmt.Println("run:", err)
	_, err = e.Leader(ctx)
	fmt.Println("after:", err)
	// Output:
	// leader: host-a fence: 1
	// run: <nil>
	// after: election: no leader
}

func ExampleElection_Campaign() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	e, err := election.New(client, "reports", election.WithIdentity("host-b"))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	t, err := e.Campaign(ctx) // waits until this candidate leads
	if err != nil {
		panic(err)
	}
	fmt.Println("leading:", t.Context().Err() == nil)
	// Hand over: a candidate waiting in Campaign is woken at once.
	if err := t.Resign(ctx); err != nil {
		panic(err)
	}
	fmt.Println("after Resign:", context.Cause(t.Context()))
	// Output:
	// leading: true
	// after Resign: redlock: unlocked
}

func ExampleElection_Observe() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	e, err := election.New(client, "indexer", election.WithIdentity("host-c"))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	changes := e.Observe(ctx)
	fmt.Printf("leader: %q\n", (<-changes).Identity) // nobody yet

	t, err := e.Campaign(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("leader: %q\n", (<-changes).Identity)
	if err := t.Resign(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("leader: %q\n", (<-changes).Identity)

	cancel()
	for range changes { // closed once the observer has stopped
	}
	// Output:
	// leader: ""
	// leader: "host-c"
	// leader: ""
}
