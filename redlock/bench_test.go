package redlock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

// directNodes starts 5 real nodes and returns clients straight to them.
func directNodes(b *testing.B) []redis.UniversalClient {
	b.Helper()
	rc := redistest.Start(b, 5)
	var nodes []redis.UniversalClient
	for i := range 5 {
		cl := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: true})
		b.Cleanup(func() { cl.Close() })
		nodes = append(nodes, cl)
	}
	return nodes
}

// BenchmarkFencing is the cost of fencing: an acquire and release on 5
// nodes with and without the second phase.
func BenchmarkFencing(b *testing.B) {
	nodes := directNodes(b)
	ctx := context.Background()
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("nodes=5/fencing=%v", on), func(b *testing.B) {
			c, err := New(nodes, WithFencing(on))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ReportAllocs()
			var acquire time.Duration
			for b.Loop() {
				t0 := time.Now()
				l, err := c.TryLock(ctx, "fence-bench")
				acquire += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(acquire.Nanoseconds())/float64(b.N), "acquire-ns/op")
		})
	}
}

// BenchmarkHandoff is the time from Unlock returning to the next holder's
// Lock returning, with a waiter blocked in Lock (another Client), with
// wake-up on and off (then the waiter polls with the default 50-250ms
// delay).
func BenchmarkHandoff(b *testing.B) {
	nodes := directNodes(b)
	ctx := context.Background()
	for _, wake := range []bool{true, false} {
		b.Run(fmt.Sprintf("nodes=5/wakeup=%v", wake), func(b *testing.B) {
			a, _ := New(nodes, WithWakeUp(wake))
			w, _ := New(nodes, WithWakeUp(wake))
			defer a.Close()
			defer w.Close()
			var lat []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				held, err := a.Lock(ctx, "handoff")
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan *Lock)
				go func() {
					l, err := w.Lock(ctx, "handoff")
					if err != nil {
						b.Error(err)
					}
					got <- l
				}()
				time.Sleep(5 * time.Millisecond) // the waiter is waiting
				if err := held.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				l := <-got
				lat = append(lat, time.Since(t0))
				if l != nil {
					l.Unlock(ctx)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// BenchmarkContended is g goroutines on one Client looping Lock → Unlock on
// one resource, on 5 nodes; it reports acquisitions per second and the
// longest wait in Lock.
func BenchmarkContended(b *testing.B) {
	nodes := directNodes(b)
	for _, g := range []int{8, 16} {
		b.Run(fmt.Sprintf("nodes=5/goroutines=%d", g), func(b *testing.B) {
			c, _ := New(nodes)
			defer c.Close()
			b.ReportAllocs()
			b.SetParallelism(max(g/runtime.GOMAXPROCS(0), 1))
			var mu sync.Mutex
			var maxWait time.Duration
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					t0 := time.Now()
					l, err := c.Lock(ctx, "contended")
					if err != nil {
						b.Error(err)
						return
					}
					w := time.Since(t0)
					mu.Lock()
					maxWait = max(maxWait, w)
					mu.Unlock()
					l.Unlock(ctx)
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "acq/s")
			b.ReportMetric(float64(maxWait.Nanoseconds()), "max-wait-ns")
		})
	}
}

// BenchmarkTryLockRefused is a TryLock refused on 5 real local nodes (the
// key held by another Client), with the requests it cost the nodes: a
// refused TryLock sends each node one acquire, and nothing more to a node
// that refused, also when that node answered after the call was decided
// (issue 32 step 3: before, each such straggler got a guarded release).
// The metric reqs/op counts the requests the nodes served per TryLock
// (INFO commandstats, every command but INFO).
func BenchmarkTryLockRefused(b *testing.B) {
	nodes := directNodes(b)
	ctx := context.Background()
	holder, err := New(nodes)
	if err != nil {
		b.Fatal(err)
	}
	defer holder.Close()
	held, err := holder.Lock(ctx, "refused")
	if err != nil {
		b.Fatal(err)
	}
	defer held.Unlock(ctx)
	c, err := New(nodes)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	before := requestsServed(b, nodes)
	for b.Loop() {
		if _, err := c.TryLock(ctx, "refused"); !errors.Is(err, ErrNotObtained) {
			b.Fatalf("TryLock = %v; want ErrNotObtained", err)
		}
	}
	b.StopTimer()
	// The stragglers' answers and any releases land within a node timeout.
	time.Sleep(50 * time.Millisecond)
	b.ReportMetric(float64(requestsServed(b, nodes)-before)/float64(b.N), "reqs/op")
}

// requestsServed sums the calls of every top-level command the nodes
// served but INFO (a script's own commands are not requests).
func requestsServed(b testing.TB, nodes []redis.UniversalClient) int64 {
	b.Helper()
	var n int64
	for _, nd := range nodes {
		s, err := nd.Info(context.Background(), "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(s, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
				continue
			}
			switch name {
			case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_time", "cmdstat_ping", "cmdstat_hello",
				"cmdstat_client", "cmdstat_script", "cmdstat_publish", "cmdstat_subscribe":
			default:
				continue // called from a script (GET, SET, …): not a request of its own
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			v, _ := strconv.ParseInt(calls, 10, 64)
			n += v
		}
	}
	return n
}
