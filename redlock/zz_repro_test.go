package redlock

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

type zzGate struct {
	mu   sync.RWMutex
}

func (g *zzGate) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, n, a string) (net.Conn, error) { return next(ctx, n, a) }
}
func (g *zzGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.mu.RLock()
		g.mu.RUnlock()
		return next(ctx, cmd)
	}
}
func (g *zzGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.mu.RLock()
		g.mu.RUnlock()
		return next(ctx, cmds)
	}
}

func TestZZRepro(t *testing.T) {
	rc := redistest.Start(t, 3)
	const ttl = time.Second
	a := newClient(t, rc.Clients(), WithTTL(ttl), WithFencing(true))
	g := &zzGate{}
	bn := rc.Clients()
	for _, n := range bn {
		n.(*redis.Client).AddHook(g)
	}
	b := newClient(t, bn, WithTTL(ttl), WithFencing(true))
	held, err := a.Lock(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsync(t, b, "x")
	if !eventually(5*time.Second, func() bool {
		for i := range 3 {
			if n, _ := rc.Admin(i).ZCard(t.Context(), "lock:x:queue").Result(); n != 1 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("not queued")
	}
	rc.SetLatency(0, 400*time.Millisecond)
	held.Unlock(t.Context())
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	tok := r.l.Token()
	t.Logf("b holds, %v", time.Since(r.at))
	r.l.Unlock(context.Background())
	unlocked := time.Now()
	g.mu.Lock()
	go func() { time.Sleep(3 * time.Second); g.mu.Unlock() }()
	time.Sleep(1500 * time.Millisecond)
	rc.SetLatency(0, 0)
	off := time.Now()
	for time.Since(off) < 3*time.Second {
		for i := range 3 {
			v, _ := rc.Admin(i).Get(t.Context(), "lock:x").Result()
			if v == tok {
				pttl, _ := rc.Admin(i).PTTL(t.Context(), "lock:x").Result()
				t.Logf("node %d holds b's token %v after unlock (%v after latency off), pttl %v", i, time.Since(unlocked), time.Since(off), pttl)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
