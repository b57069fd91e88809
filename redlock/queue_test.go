package redlock

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/scripts"
)

// Tests of the waiter queue and direct handoff (DESIGN step 9).

// A release hands the key to the first waiter queued: the waiter's Lock
// returns within a round trip or two of the Unlock, and the releaser's own
// immediate Lock does not jump the queue.
func TestReal_handoffGoesToTheWaiterNotBackToTheReleaser(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := newClient(t, rc.Clients())
	held, err := a.Lock(t.Context(), "q")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *Lock
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		// The fallback delay is 2-3s: only a handoff can be faster.
		l, err := b.Lock(t.Context(), "q", WithRetryDelay(2*time.Second, 3*time.Second))
		got <- result{l, time.Now(), err}
	}()
	if !eventually(10*time.Second, func() bool {
		n, _ := rc.Admin(0).ZCard(t.Context(), "lock:q"+scripts.QueueSuffix).Result()
		return n == 1
	}) {
		t.Fatal("the waiter never queued")
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	unlocked := time.Now()
	// The releaser tries again at once: the key is the waiter's now.
	if l, err := a.TryLock(t.Context(), "q"); err == nil {
		l.Unlock(context.Background())
		t.Errorf("the releaser took the lock back before the queued waiter")
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter Lock = %v", r.err)
	}
	// Measured a few ms here; 1s is far below the 2s fallback.
	if d := r.at.Sub(unlocked); d > time.Second {
		t.Errorf("waiter acquired %v after Unlock; want a handoff, not the 2-3s retry delay", d)
	}
	if err := r.l.Unlock(t.Context()); err != nil {
		t.Errorf("waiter Unlock = %v", err)
	}
	if !noLockKey(t, rc, "lock:q", 5*time.Second) {
		t.Errorf("a key is left after both released")
	}
}

// A waiter that went away while first in the queue (its process died: here
// an entry nobody answers for) delays the next waiter by the handoff
// reservation at most, not by a TTL.
func TestReal_deadHeadWaiterDelaysTheNextByTheReservationOnly(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	const ttl = 3 * time.Second
	a := newClient(t, rc.Clients(), WithTTL(ttl))
	b := newClient(t, rc.Clients(), WithTTL(ttl))
	held, err := a.Lock(t.Context(), "dead")
	if err != nil {
		t.Fatal(err)
	}
	// The dead waiter: queued with the oldest ticket, its entry good for a
	// minute, its client gone.
	for i := range rc.N() {
		adm := rc.Admin(i)
		adm.ZAdd(t.Context(), "lock:dead"+scripts.QueueSuffix, redisZ(1, "dead-client/dead-token"))
		adm.ZAdd(t.Context(), "lock:dead"+scripts.ExpirySuffix, redisZ(float64(time.Now().Add(time.Minute).UnixMilli()), "dead-client/dead-token"))
	}
	got := make(chan time.Time, 1)
	go func() {
		l, err := b.Lock(t.Context(), "dead")
		if err != nil {
			t.Errorf("next waiter's Lock = %v", err)
			close(got)
			return
		}
		got <- time.Now()
		l.Unlock(context.Background())
	}()
	if !eventually(10*time.Second, func() bool {
		n, _ := rc.Admin(0).ZCard(t.Context(), "lock:dead"+scripts.QueueSuffix).Result()
		return n == 2
	}) {
		t.Fatal("the next waiter never queued")
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	unlocked := time.Now()
	at, ok := <-got
	if !ok {
		return
	}
	reservation := held.cfg.reservation()
	waited := at.Sub(unlocked)
	t.Logf("next waiter acquired %v after the Unlock (reservation %v, TTL %v)", waited.Round(time.Millisecond), reservation, ttl)
	// The reservation, one fallback delay (250ms at most) and slack for a
	// loaded machine: far less than the TTL the key would otherwise hold.
	if limit := reservation + DefaultRetryDelayMax + 1500*time.Millisecond; waited > limit || waited < reservation/2 {
		t.Errorf("next waiter acquired %v after the Unlock; want about the reservation %v, at most %v", waited, reservation, limit)
	}
}

// 8 clients on one key, each acquiring in a loop: the queue serves them
// in turn (most handoffs go to another client), every one acquires, and no
// two holds overlap. 16 goroutines on 4 clients run the same way.
// QUORUMLOCK_CONTENTION_SECONDS sets how long (default 2; 10 for the
// issue's figure).
func TestReal_contentionEveryoneAcquiresInTurn(t *testing.T) {
	t.Parallel()
	secs := 2
	if s := os.Getenv("QUORUMLOCK_CONTENTION_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("QUORUMLOCK_CONTENTION_SECONDS=%q: want a positive number", s)
		}
		secs = n
	}
	rc := redistest.Start(t, 5)
	const clients, perClient = 4, 4
	var cs []*Client
	for range clients {
		cs = append(cs, newClient(t, rc.Clients()))
	}
	var (
		inside  atomic.Int32
		overlap atomic.Int32
		mu      sync.Mutex
		waits   []time.Duration
		counts  = make([]int, clients*perClient)
		last    = -1
		handoff int
		total   int
	)
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(secs)*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range clients * perClient {
		c := cs[g%clients]
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				l, err := c.Lock(ctx, "busy")
				if err != nil {
					return
				}
				if inside.Add(1) != 1 {
					overlap.Add(1)
				}
				mu.Lock()
				waits = append(waits, time.Since(start))
				counts[g]++
				if last >= 0 && last%clients != g%clients {
					handoff++
				}
				last = g
				total++
				mu.Unlock()
				inside.Add(-1)
				if err := l.Unlock(context.Background()); err != nil {
					t.Errorf("Unlock = %v", err)
				}
			}
		})
	}
	wg.Wait()
	if n := overlap.Load(); n != 0 {
		t.Errorf("%d overlapping holds", n)
	}
	for g, n := range counts {
		if n == 0 {
			t.Errorf("goroutine %d (client %d) never acquired in %ds", g, g%clients, secs)
		}
	}
	slices.Sort(waits)
	p := func(q float64) time.Duration { return waits[min(len(waits)-1, int(q*float64(len(waits))))] }
	t.Logf("%d acquisitions in %ds (%.0f/s) by 16 goroutines on 4 clients; %.0f%% handed to another client; wait p50 %v p99 %v max %v",
		total, secs, float64(total)/float64(secs), 100*float64(handoff)/float64(max(total-1, 1)),
		p(0.5).Round(time.Microsecond), p(0.99).Round(time.Microsecond), waits[len(waits)-1].Round(time.Microsecond))
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
