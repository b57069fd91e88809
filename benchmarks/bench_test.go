package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
	"github.com/quorumlock/quorumlock/internal/redistest"
)

const (
	// ttl is the lease of every library: redsync's default expiry, so that
	// its node timeout (TTL*0.05) is its own default; quorumlock's node
	// timeout is TTL/10.
	ttl = 8 * time.Second
	// contenders is the number of goroutines fighting for one resource.
	contenders = 8
	// handoffHold is how long the holder keeps the lock before releasing it
	// in the handoff case (untimed), so that the waiter is in its retry
	// delay, as it would be behind a real critical section.
	handoffHold = 10 * time.Millisecond
	maxNodes    = 5
)

// nodeCounts are the cluster sizes every Redlock library is measured at.
var nodeCounts = []int{1, 3, 5}

// shared holds the nodes every benchmark uses: maxNodes redis-server
// processes started once, outside any timed region, and clients that talk
// to the servers directly (the slow-node cases add a proxy of their own).
var shared struct {
	once    sync.Once
	err     error
	cluster *redistest.Cluster
	clients []redis.UniversalClient
}

func sharedNodes(tb testing.TB, n int) []redis.UniversalClient {
	tb.Helper()
	if !redistest.Available() {
		msg := "redis-server not found on PATH; the benchmarks need real nodes: " + redistest.InstallHint
		if os.Getenv("CI") != "" {
			tb.Fatal(msg + " (failing, not skipping, because CI is set)")
		}
		tb.Skip(msg)
	}
	shared.once.Do(func() {
		shared.cluster, shared.err = redistest.StartCluster(maxNodes)
		if shared.err != nil {
			return
		}
		for i := range maxNodes {
			shared.clients = append(shared.clients, redis.NewClient(nodes.Options(shared.cluster.ServerAddr(i))))
		}
	})
	if shared.err != nil {
		tb.Fatalf("starting %d redis-server nodes: %v", maxNodes, shared.err)
	}
	return shared.clients[:n]
}

func closeShared() error {
	if shared.cluster == nil {
		return nil
	}
	return errors.Join(nodes.CloseAll(shared.clients), shared.cluster.Close())
}

// newLocker builds lib over nodes and closes it when b ends.
func newLocker(tb testing.TB, lib libs.Lib, nodes []redis.UniversalClient) libs.Locker {
	tb.Helper()
	lk, err := lib.New(lib.Nodes(nodes), ttl)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := lk.Close(); err != nil {
			tb.Errorf("%s: Close: %v", lib.Name, err)
		}
	})
	return lk
}

func mustLib(name string) libs.Lib {
	l, ok := libs.ByName(name)
	if !ok {
		panic("no library " + name)
	}
	return l
}

// runs lists the library × node-count pairs of a case: the Redlock
// libraries at every count, redislock at one node only, and the floor when
// the case has one.
func runs(withFloor bool) []struct {
	lib libs.Lib
	n   int
} {
	var out []struct {
		lib libs.Lib
		n   int
	}
	for _, n := range nodeCounts {
		names := []string{"quorumlock", "redsync"}
		if n == 1 {
			names = append(names, "redislock")
		}
		if withFloor {
			names = append(names, "floor")
		}
		for _, name := range names {
			out = append(out, struct {
				lib libs.Lib
				n   int
			}{mustLib(name), n})
		}
	}
	return out
}

func name(lib string, n int, c string) string {
	return fmt.Sprintf("lib=%s/nodes=%d/case=%s", lib, n, c)
}

// resource returns a key of its own for each library and case, so that no
// benchmark sees another's leftovers.
func resource(lib, c string) string { return "bench:" + lib + ":" + c }

// BenchmarkAcquireRelease is one uncontended Lock and Unlock. acquire-ns/op
// is the Lock alone.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, r := range runs(true) {
		b.Run(name(r.lib.Name, r.n, "acquire-release"), func(b *testing.B) {
			lk := newLocker(b, r.lib, sharedNodes(b, r.n))
			acquireRelease(b, lk, resource(r.lib.Name, "ar"))
		})
	}
}

// acquireRelease is pacedAcquireRelease without the pause.
func acquireRelease(b *testing.B, lk libs.Locker, res string) {
	pacedAcquireRelease(b, lk, res, 0)
}

// BenchmarkExtend is one Extend of a held lock (a renewal round).
func BenchmarkExtend(b *testing.B) {
	for _, r := range runs(true) {
		b.Run(name(r.lib.Name, r.n, "extend"), func(b *testing.B) {
			lk := newLocker(b, r.lib, sharedNodes(b, r.n))
			ctx := b.Context()
			h, err := lk.Lock(ctx, resource(r.lib.Name, "extend"))
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := h.Unlock(context.Background()); err != nil {
					b.Error(err)
				}
			}()
			b.ReportAllocs()
			for b.Loop() {
				if err := h.Extend(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSlowNode is acquire+release with node 0 behind a proxy that
// delays each direction by 2ms or 20ms (redistest.Proxy, our own; no
// toxiproxy). A Redlock client that decides on the first majority should
// not wait for it: acquire-ns/op is the Lock alone. One node alone has
// nothing to ignore, so N starts at 3.
//
// lib=floor here is the floor without the slow node (all N nodes direct),
// paced like the libraries: after each round it idles 4×d (timed), as long
// as a release through the slow node takes (the straggling acquire, 2×d,
// then the release, 2×d). Idle nodes and threads answer the next round
// slower than busy ones (measured: the floor's acquire goes from ~0.2ms to
// ~0.7ms after an 80ms pause), so an unpaced floor would flatter the ratio.
func BenchmarkSlowNode(b *testing.B) {
	for _, d := range []time.Duration{2 * time.Millisecond, 20 * time.Millisecond} {
		for _, n := range nodeCounts[1:] {
			for _, lname := range []string{"quorumlock", "redsync", "floor"} {
				c := fmt.Sprintf("slow%v", d)
				b.Run(name(lname, n, c), func(b *testing.B) {
					ns := sharedNodes(b, n)
					if lname == "floor" {
						lk := newLocker(b, mustLib(lname), ns)
						pacedAcquireRelease(b, lk, resource(lname, c), 4*d)
						return
					}
					p, err := redistest.NewProxy(shared.cluster.ServerAddr(0))
					if err != nil {
						b.Fatal(err)
					}
					p.SetLatency(d)
					slow := redis.NewClient(nodes.Options(p.Addr()))
					b.Cleanup(func() {
						slow.Close()
						p.Close()
					})
					ns = append([]redis.UniversalClient{slow}, ns[1:]...)
					lk := newLocker(b, mustLib(lname), ns)
					acquireRelease(b, lk, resource(lname, c))
				})
			}
		}
	}
}

// pacedAcquireRelease is acquireRelease with a pause after each round. The
// pause is timed (so ns/op includes it): paused untimed, a round of 0.4ms
// would need thousands of 80ms pauses to fill -benchtime. Read
// acquire-ns/op.
func pacedAcquireRelease(b *testing.B, lk libs.Locker, res string, pause time.Duration) {
	ctx := b.Context()
	var acquire time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		h, err := lk.Lock(ctx, res)
		acquire += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	b.ReportMetric(float64(acquire.Nanoseconds())/float64(b.N), "acquire-ns/op")
}

// BenchmarkContended runs 8 goroutines that Lock and Unlock one resource in
// a loop; ns/op is the time per acquisition of the group. maxwait-ms is the
// longest a goroutine waited in Lock, other-% the share of handoffs that
// went to a goroutine other than the one that released. Exactly 8
// goroutines whatever GOMAXPROCS is, so not b.RunParallel (which starts a
// multiple of GOMAXPROCS).
func BenchmarkContended(b *testing.B) {
	for _, r := range runs(false) {
		b.Run(name(r.lib.Name, r.n, "contended"), func(b *testing.B) {
			lk := newLocker(b, r.lib, sharedNodes(b, r.n))
			res := resource(r.lib.Name, "contended")
			ctx := b.Context()
			var (
				left     atomic.Int64
				wg       sync.WaitGroup
				mu       sync.Mutex // protects the fields below
				last     = -1       // goroutine that released last
				handoffs int
				toOther  int
				maxWait  time.Duration
				failed   error
			)
			left.Store(int64(b.N))
			b.ReportAllocs()
			b.ResetTimer()
			for g := range contenders {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						start := time.Now()
						h, err := lk.Lock(ctx, res)
						wait := time.Since(start)
						mu.Lock()
						maxWait = max(maxWait, wait)
						if err != nil {
							failed = err
							mu.Unlock()
							return
						}
						if last >= 0 {
							handoffs++
							if last != g {
								toOther++
							}
						}
						last = g
						mu.Unlock()
						if err := h.Unlock(ctx); err != nil {
							mu.Lock()
							failed = err
							mu.Unlock()
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if failed != nil {
				b.Fatal(failed)
			}
			b.ReportMetric(float64(maxWait)/float64(time.Millisecond), "maxwait-ms")
			if handoffs > 0 {
				b.ReportMetric(100*float64(toOther)/float64(handoffs), "other-%")
			}
		})
	}
}

// BenchmarkHandoff times one handoff: from the holder calling Unlock to the
// waiter, blocked in Lock, holding the lock. Without a wake-up on release
// the waiter finds out at its next retry (50ms..250ms after its last try).
func BenchmarkHandoff(b *testing.B) {
	for _, r := range runs(false) {
		b.Run(name(r.lib.Name, r.n, "handoff"), func(b *testing.B) {
			lk := newLocker(b, r.lib, sharedNodes(b, r.n))
			res := resource(r.lib.Name, "handoff")
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				h, err := lk.Lock(ctx, res)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan libs.Held, 1)
				errc := make(chan error, 1)
				go func() {
					w, err := lk.Lock(ctx, res)
					if err != nil {
						errc <- err
						return
					}
					got <- w
				}()
				time.Sleep(handoffHold)
				b.StartTimer()
				if err := h.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				var w libs.Held
				select {
				case w = <-got:
				case err := <-errc:
					b.Fatal(err)
				}
				b.StopTimer()
				if err := w.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
