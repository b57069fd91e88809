package redlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/quorumlock/quorumlock/redlock"
)

// ExampleClient_RLock shows readers sharing a resource and a writer
// excluded until the last of them unlocks.
func ExampleClient_RLock() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx := context.Background()

	r1, err := client.RLock(ctx, "report")
	if err != nil {
		panic(err)
	}
	r2, err := client.RLock(ctx, "report") // readers share
	if err != nil {
		panic(err)
	}
	fmt.Println("two readers:", r1.Valid() && r2.Valid(), r1.Mode())

	_, err = client.TryWLock(ctx, "report")
	fmt.Println("writer beside readers:", errors.Is(err, redlock.ErrNotObtained))

	r1.Unlock(ctx)
	r2.Unlock(ctx)
	w, err := client.WLock(ctx, "report")
	if err != nil {
		panic(err)
	}
	_, err = client.TryRLock(ctx, "report")
	fmt.Println("reader beside the writer:", errors.Is(err, redlock.ErrNotObtained))
	w.Unlock(ctx)
	// Output:
	// two readers: true read
	// writer beside readers: true
	// reader beside the writer: true
}

// ExampleClient_LockAll locks two resources together; a lock of either
// one is refused while the multi-lock holds them.
func ExampleClient_LockAll() {
	nodes, stop := nodes(3)
	defer stop()
	client, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx := context.Background()

	both, err := client.LockAll(ctx, []string{"account:2", "account:1"})
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", both.Resources())

	_, err = client.TryLock(ctx, "account:1")
	fmt.Println("account:1 alone:", errors.Is(err, redlock.ErrNotObtained))

	if err := both.Unlock(ctx); err != nil {
		panic(err)
	}
	// Output:
	// held: [account:1 account:2]
	// account:1 alone: true
}
