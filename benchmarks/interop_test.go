package benchmarks

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// beside returns a quorumlock Client with the lock keys redsync uses (no
// prefix) and a redsync over the same nodes: the processes of a rolling
// migration. The Client is closed when the test ends.
func beside(t *testing.T, rc *redistest.Cluster) (*redlock.Client, *redsync.Redsync) {
	t.Helper()
	q := newRedlock(t, rc.Clients(), redlock.WithKeyPrefix(""))
	pools := make([]redsyncredis.Pool, rc.N())
	for i, n := range rc.Clients() {
		pools[i] = goredis.NewPool(n)
	}
	return q, redsync.New(pools...)
}

// A rolling migration runs redsync processes beside quorumlock ones on the
// same nodes and keys (WithKeyPrefix("")). A quorumlock release deletes the
// lock key, so redsync can take the lock within one round trip of Unlock —
// also with a subscriber on the node and after a late request of ours.
func TestInterop_redsyncTakesTheLockRightAfterUnlock(t *testing.T) {
	rc := redistest.Start(t, 5)
	q, rs := beside(t, rc)
	ctx := t.Context()

	// Someone waits on the resource's wake-up channel on every node.
	for i := range rc.N() {
		ps := rc.Admin(i).Subscribe(ctx, "migrating")
		t.Cleanup(func() { ps.Close() })
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var times []time.Duration
	var lastGone time.Duration
	for trial := range 20 {
		l, err := q.Lock(ctx, "migrating", redlock.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if trial%5 == 4 {
			// A late Extend of ours on a slow node lands after the Unlock.
			rc.SetLatency(0, 300*time.Millisecond)
			if err := l.Extend(ctx); err != nil {
				t.Fatal(err)
			}
			rc.SetLatency(0, 0)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		unlocked := time.Now()
		m := rs.NewMutex("migrating", redsync.WithTries(1), redsync.WithExpiry(time.Second))
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("trial %d: redsync TryLock right after a quorumlock Unlock = %v; want the lock", trial, err)
		}
		// redsync's one try succeeded: the key was gone from a majority
		// when Unlock returned. Its time is one parallel round trip
		// (~0.3ms idle, 1–15ms on a loaded 2-core machine); the bound
		// catches a key kept held for a while after the release (the old
		// tombstone kept redsync out for 2 node timeouts + 250ms).
		took := time.Since(unlocked)
		times = append(times, took)
		if took > 250*time.Millisecond {
			t.Errorf("trial %d: redsync took %v after Unlock; want one round trip", trial, took)
		}
		if trial%5 == 4 {
			// Give the late request time to land, while redsync holds.
			time.Sleep(400 * time.Millisecond)
		}
		if ok, err := m.UnlockContext(ctx); !ok || err != nil {
			t.Fatalf("trial %d: redsync Unlock = %v, %v; want true (its key untouched by our late request)", trial, ok, err)
		}
		// Our Unlock returned once a majority released; the other nodes'
		// releases may still be on their way: an immediate read found one
		// there in 2 to 3 of 10 runs at load 4-8. Each key must go well
		// within the 2s TTL (the five reads and their wait took 1-4ms in
		// all, 10 runs at load 4), and none come back.
		released := time.Now()
		for i := range rc.N() {
			for {
				v, err := rc.Admin(i).Get(ctx, "migrating").Result()
				if errors.Is(err, redis.Nil) {
					break
				}
				if time.Since(released) > 500*time.Millisecond {
					t.Errorf("trial %d: node %d holds %q 500ms after both released; want no key", trial, i, v)
					break
				}
				time.Sleep(time.Millisecond)
			}
			lastGone = max(lastGone, time.Since(released))
		}
	}
	t.Logf("every node's key gone at most %v after redsync's Unlock returned", lastGone)
	slices.Sort(times)
	t.Logf("redsync's single try after a quorumlock Unlock: median %v, max %v (20 trials)", times[len(times)/2], times[len(times)-1])
}
