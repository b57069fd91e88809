package benchmarks

import (
	"context"
	"fmt"
	"math/rand"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkZipfContention is contention across resources: 64 goroutines
// lock resources drawn from 1,000 with a Zipf skew (a few hot, a long
// tail), hold each for 1ms and unlock. It reports acquisitions per second
// and the p99 and max wait in Lock, on 5 nodes, for quorumlock and redsync.
//
//	cd benchmarks && go test -run '^$' -bench Zipf -benchtime 10s
func BenchmarkZipfContention(b *testing.B) {
	const goroutines, resources = 64, 1000
	for _, libName := range []string{"quorumlock", "redsync"} {
		b.Run(name(libName, 5, "zipf64x1000"), func(b *testing.B) {
			b.ReportAllocs()
			lk := newLocker(b, mustLib(libName), sharedNodes(b, 5))
			var (
				mu    sync.Mutex
				waits []time.Duration
				seed  int64
			)
			b.SetParallelism(max(goroutines/runtime.GOMAXPROCS(0), 1))
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				seed++
				r := rand.New(rand.NewSource(seed))
				mu.Unlock()
				zipf := rand.NewZipf(r, 1.1, 1, resources-1)
				var local []time.Duration
				for pb.Next() {
					res := fmt.Sprintf("bench:%s:zipf:%d", libName, zipf.Uint64())
					t0 := time.Now()
					h, err := lk.Lock(context.Background(), res)
					if err != nil {
						b.Errorf("Lock(%s) = %v", res, err)
						return
					}
					local = append(local, time.Since(t0))
					time.Sleep(time.Millisecond)
					if err := h.Unlock(context.Background()); err != nil {
						b.Errorf("Unlock = %v", err)
						return
					}
				}
				mu.Lock()
				waits = append(waits, local...)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			if len(waits) == 0 {
				return
			}
			slices.Sort(waits)
			b.ReportMetric(float64(len(waits))/elapsed.Seconds(), "acq/s")
			b.ReportMetric(float64(waits[len(waits)*99/100])/1e6, "p99-wait-ms")
			b.ReportMetric(float64(waits[len(waits)-1])/1e6, "max-wait-ms")
		})
	}
}
