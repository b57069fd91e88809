package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// Issue 44 item 6, on real nodes: Close removes this Client's identity key
// (lock:node:<id>:<i>) from a node that came back moments before Close,
// while its "last dial failed" flag is still set (it lasts until the next
// probe). Before, Close skipped such a node and the key stayed for
// IdentifyTTL, an hour: 4 of 4 with Close 10ms after recovery. The Client
// reaches the servers directly, so that a killed node refuses its dials;
// the node comes back with its keys (as with persistence: Restart starts
// it empty, so the test writes the identity key back as it was).
func TestReal_closeForgetsIdentityOnANodeJustBack(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c, err := New(directClients(t, rc), WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	l, err := c.Lock(t.Context(), "identity")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	idKeys := func() []string {
		keys, err := rc.Admin(2).Keys(context.Background(), "lock:node:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if !eventually(5*time.Second, func() bool { return len(idKeys()) == 1 }) {
		t.Fatalf("node 2 identity keys = %q; want this Client's one", idKeys())
	}
	key := idKeys()[0]
	// Kill node 2 until a dial of the Client's to it has failed.
	rc.Kill(2)
	if !eventually(10*time.Second, func() bool {
		if l, err := c.TryLock(t.Context(), "identity"); err == nil {
			l.Unlock(t.Context())
		}
		return c.nodes[2].Health.Down() != nil
	}) {
		t.Fatal("node 2 never looked down to the Client")
	}
	rc.Restart(2)
	if err := rc.Admin(2).Set(context.Background(), key, "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if c.nodes[2].Health.Down() == nil {
		t.Log("node 2 was probed up again before Close: the case is not the one this test is about")
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Logf("Close = %v", err)
	}
	took := time.Since(start)
	if keys := idKeys(); len(keys) != 0 {
		t.Errorf("after Close, node 2 keeps identity keys %q (PTTL %v); want none", keys, rc.Admin(2).PTTL(context.Background(), keys[0]).Val())
	}
	// One bound: the node timeout (1s) and the grace.
	if took > 5*time.Second {
		t.Errorf("Close took %v; want it bounded by the node timeout and its grace", took)
	}
}
