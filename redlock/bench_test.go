package redlock

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// BenchmarkTryLockUnlock is one uncontended acquire and release on N real
// local nodes, next to the physical floor: one SET NX PX and one DEL on a
// single node (two plain round trips).
//
//	go test -run '^$' -bench . -count 5 ./redlock | benchstat -
func BenchmarkTryLockUnlock(b *testing.B) {
	rc := redistest.Start(b, 5)
	ctx := context.Background()
	// Straight to the servers: the proxies are for fault tests.
	var nodes []redis.UniversalClient
	for i := range 5 {
		cl := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: true})
		b.Cleanup(func() { cl.Close() })
		nodes = append(nodes, cl)
	}
	for _, n := range []int{1, 3, 5} {
		b.Run(fmt.Sprintf("lib=quorumlock/nodes=%d", n), func(b *testing.B) {
			c, err := New(nodes[:n])
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.TryLock(ctx, "bench")
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("lib=floor/nodes=1", func(b *testing.B) {
		node := nodes[0]
		b.ReportAllocs()
		for b.Loop() {
			if err := node.SetNX(ctx, "floor", "x", DefaultTTL).Err(); err != nil {
				b.Fatal(err)
			}
			if err := node.Del(ctx, "floor").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
