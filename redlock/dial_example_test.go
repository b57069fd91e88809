package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"

	"github.com/quorumlock/quorumlock/redlock"
)

// Dial builds the node clients from URLs (redis://, rediss://, unix://,
// redis+sentinel://, redis+cluster://), checks that a majority answers, and
// closes the clients on Close.
func ExampleDial() {
	var urls []string
	for range 3 {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			panic(err)
		}
		defer m.Close()
		m.RequireAuth("s3cret")
		urls = append(urls, "redis://:s3cret@"+m.Addr())
	}
	ctx := context.Background()
	client, err := redlock.Dial(ctx, urls)
	if err != nil {
		panic(err)
	}
	defer client.Close() // also closes the clients Dial built

	err = client.Do(ctx, "invoice:1234", func(ctx context.Context) error {
		fmt.Println("locked")
		return nil
	})
	fmt.Println("Do:", err)

	// A wrong password is refused at Dial, naming the node and its reply
	// (the password itself is never printed).
	wrong := strings.ReplaceAll(urls[0], "s3cret", "wrong")
	_, err = redlock.Dial(ctx, []string{wrong, urls[1], urls[2]})
	var ne *redlock.NodeError
	if errors.As(err, &ne) {
		fmt.Printf("node %d: %v\n", ne.Node, ne.Err)
	}
	// Output:
	// locked
	// Do: <nil>
	// node 0: WRONGPASS invalid username-password pair
}
