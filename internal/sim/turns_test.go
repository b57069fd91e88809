package sim

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
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
//
// go-redis counts a wait for a turn that got one (WaitCount) or timed out
// (Timeouts), not one its caller's ctx ended; so the test also counts the
// commands in the pool at once (a hook inside turns): at most turnLimit,
// which with maxDials background dials leaves a turn of the pool free.
func TestTurns_poolNeverWaits(t *testing.T) {
	for _, run := range []struct {
		name   string
		hooked bool
	}{{"hooked", true}, {"hooked-again", true}, {"unhooked", false}} {
		ok := t.Run(run.name, func(t *testing.T) {
			st, most := saturate(t, run.hooked)
			waited := st.WaitCount + st.Timeouts
			t.Logf("pool: %d waits for a turn, %d timeouts, %d hits, %d misses; at most %d commands in it at once", st.WaitCount, st.Timeouts, st.Hits, st.Misses, most)
			if run.hooked && (waited != 0 || most > turnLimit) {
				t.Fatalf("go-redis waited for a pool turn %d times (%d timed out), with up to %d commands in the pool at once: the turns hook lets at most %d in", waited, st.Timeouts, most, turnLimit)
			}
			if !run.hooked && waited == 0 {
				t.Fatal("without the hook the load never made go-redis wait for a turn: it cannot show that the hook prevents it")
			}
		})
		if !ok {
			// The next bubble could draw a timer this one left in
			// go-redis's pool, which is fatal: stop here, and drop it.
			break
		}
	}
	// The unhooked run left a timer of its finished bubble in go-redis's
	// pool of timers. sync.Pool drops what it holds over two collections
	// (the first moves it to the victim cache), so no later test can draw it.
	runtime.GC()
	runtime.GC()
}

// saturate runs 64 goroutines' commands against a paused node for two
// seconds of fake time, resetting the connections every 250ms, then lets
// the node go on, and returns the node client's pool statistics and the
// most commands that were in its pool at once.
func saturate(t *testing.T, hooked bool) (redis.PoolStats, int64) {
	var st redis.PoolStats
	in := &inPool{}
	synctest.Test(t, func(t *testing.T) {
		cl := newCluster(1, 1, 1, nil, nil)
		defer cl.close()
		var c *redis.Client
		if hooked {
			c = cl.clients(0)[0].(*redis.Client)
		} else {
			c = redis.NewClient(cl.nodeOptions(0, 0))
		}
		c.AddHook(in) // inside turns: what reaches the pool
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
	return st, in.most.Load()
}

// inPool is a redis.Hook that records the most commands in it at once.
type inPool struct{ n, most atomic.Int64 }

func (h *inPool) enter() {
	n := h.n.Add(1)
	for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
	}
}

func (h *inPool) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *inPool) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if handshake(cmd) {
			return next(ctx, cmd) // on the connection its command's turn dials
		}
		h.enter()
		defer h.n.Add(-1)
		return next(ctx, cmd)
	}
}

func (h *inPool) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.enter()
		defer h.n.Add(-1)
		return next(ctx, cmds)
	}
}
