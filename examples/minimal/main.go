// Command minimal is the smallest complete quorumlock program: nodes, a
// Client, a Lock bounded by a timeout, the work, and Unlock.
package main

import (
	"context"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	// Three independent Redis masters. Here they are embedded (miniredis); for
	// yours: redis.NewClient(&redis.Options{Addr: "10.0.0.1:6379", ContextTimeoutEnabled: true}).
	var nodes []redis.UniversalClient
	for range 3 {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		defer m.Close()
		m.ClockTTL(true) // keys expire in real time, as on Redis
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}))
	}

	client, err := redlock.New(nodes, redlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close() // stops renewals, releases what is still held

	// Lock waits for the lock until ctx is done: always bound it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lock, err := client.Lock(ctx, "invoice:1234")
	if err != nil {
		log.Fatal(err) // redlock.ErrNotObtained: held by another; ErrNoQuorum: nodes down
	}
	defer lock.Unlock(context.Background()) // bounded by the node timeout

	work := time.After(time.Second) // your job; run it under lock.Context()
	select {
	case <-work:
		log.Printf("done; the lock was valid for %v more", time.Until(lock.ValidUntil()).Round(time.Millisecond))
	case <-lock.Lost(): // renewals failed on a majority: stop, another client may hold it now
		log.Print("lock lost: ", context.Cause(lock.Context()))
	}
}
