package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// pipelines counts pipelines and commands sent to a node.
type pipelines struct{ pipes, cmds atomic.Int64 }

func (p *pipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.pipes.Add(1)
		p.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// lockMany acquires k locks "<prefix><i>" concurrently.
func lockMany(t *testing.T, c *Client, prefix string, k int, opts ...Option) []*Lock {
	t.Helper()
	locks := make([]*Lock, k)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range k {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			l, err := c.Lock(t.Context(), fmt.Sprint(prefix, i), opts...)
			if err != nil {
				t.Errorf("Lock %d = %v", i, err)
				return
			}
			locks[i] = l
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return locks
}

func TestReal_batchedRenewals(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	nodes := rc.Clients()
	counter := &pipelines{}
	nodes[0].(*redis.Client).AddHook(counter)
	c := newClient(t, nodes)
	const k = 300
	locks := lockMany(t, c, "many:", k, WithTTL(1500*time.Millisecond))
	// SCRIPT FLUSH on every node: the pipelines must load the script again.
	for i := range 5 {
		rc.Admin(i).ScriptFlush(t.Context())
	}
	time.Sleep(3 * time.Second) // six renewal intervals
	for i, l := range locks {
		if !l.Valid() {
			t.Fatalf("lock %d lost on healthy nodes", i)
		}
	}
	pipes, cmds := counter.pipes.Load(), counter.cmds.Load()
	// Unbatched, node 0 would have seen ~6×300 separate scripts; batched, a
	// few pipelines per interval carry them.
	if pipes == 0 || cmds/pipes < 10 {
		t.Errorf("node 0: %d pipelines, %d commands; want renewals batched (≥ 10 per pipeline)", pipes, cmds)
	}
	t.Logf("node 0: %d pipelines carried %d extend scripts (%.0f per pipeline)", pipes, cmds, float64(cmds)/float64(max(pipes, 1)))

	// One lock of the batch taken over on every node: that lock alone is lost.
	victim := locks[7]
	for i := range 5 {
		rc.Admin(i).Set(t.Context(), "lock:many:7", "thief", time.Minute)
	}
	select {
	case <-victim.Lost():
		if err := context.Cause(victim.Context()); !errors.Is(err, ErrLockLost) {
			t.Errorf("victim cause = %v; want ErrLockLost", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("the taken lock was not reported lost")
	}
	time.Sleep(600 * time.Millisecond)
	for i, l := range locks {
		if i != 7 && !l.Valid() {
			t.Errorf("lock %d lost along with the taken one", i)
		}
	}
	// A node restarted empty is healed by the batch.
	rc.Restart(2)
	if !eventually(2*time.Second, func() bool {
		n, _ := rc.Admin(2).DBSize(t.Context()).Result()
		return n >= k-1
	}) {
		t.Errorf("restarted node not healed by batched renewals")
	}
}
