package sim

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestTurns_poolNeverWaits is the test of the one failure the soak found:
// a node client whose pool had all its turns taken waited for one on a
// timer from go-redis's process-wide pool of timers, and a timer made in
// one bubble and used in another is fatal. With the turns hook, 64
// goroutines sending to a paused node (their commands time out, their
// connections are reset, new ones are dialed) never make go-redis wait for
// a turn, in two bubbles one after the other. The same load without the
// hook does wait: the test would see the slow path if the hook let it
// through.
func TestTurns_poolNeverWaits(t *testing.T) {
	for _, run := range []struct {
		name   string
		hooked bool
	}{{"hooked", true}, {"hooked-again", true}, {"unhooked", false}} {
		t.Run(run.name, func(t *testing.T) {
			st := saturate(t, run.hooked)
			waited := st.WaitCount + st.Timeouts
			t.Logf("pool: %d waits for a turn, %d timeouts, %d hits, %d misses", st.WaitCount, st.Timeouts, st.Hits, st.Misses)
			if run.hooked && waited != 0 {
				t.Fatalf("go-redis waited for a pool turn %d times (%d timed out): the turns hook let more than %d commands reach the pool", waited, st.Timeouts, turnLimit)
			}
			if !run.hooked && waited == 0 {
				t.Fatal("without the hook the load never made go-redis wait for a turn: it cannot show that the hook prevents it")
			}
		})
	}
	// The unhooked run left a timer of its finished bubble in go-redis's
	// pool of timers. sync.Pool drops what it holds over two collections
	// (the first moves it to the victim cache), so no later test can draw it.
	runtime.GC()
	runtime.GC()
}

// saturate runs 64 goroutines' commands against a paused node for two
// seconds of fake time, resetting the connections every 250ms, then lets
// the node go on, and returns the node client's pool statistics.
func saturate(t *testing.T, hooked bool) redis.PoolStats {
	var st redis.PoolStats
	synctest.Test(t, func(t *testing.T) {
		cl := newCluster(1, 1, 1)
		defer cl.close()
		var c *redis.Client
		if hooked {
			c = cl.clients(0)[0].(*redis.Client)
		} else {
			c = redis.NewClient(cl.nodeOptions(0, 0))
		}
		defer c.Close()
		ctx := context.Background()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("ping before the pause: %v", err)
		}
		cl.net.pauseNode(0, true)
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				for r := range 3 {
					// 0.3-3.3s: some give up while queued, some after
					// go-redis's pool timeout (2s) would have passed.
					d := time.Duration(300+(g*37+r*101)%3000) * time.Millisecond
					cctx, cancel := context.WithTimeout(ctx, d)
					_ = c.Get(cctx, "k").Err() // fails while the node is paused
					cancel()
				}
			})
		}
		for range 8 {
			time.Sleep(250 * time.Millisecond)
			cl.net.reset(0, 0)
		}
		cl.net.pauseNode(0, false)
		wg.Wait()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Errorf("ping after the pause: %v", err)
		}
		st = *c.PoolStats()
	})
	return st
}
