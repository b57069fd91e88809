package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// testSet returns a Set over n miniredis nodes (whose TIME is this
// process's clock); its background goroutines end before the test's
// cleanup returns.
func testSet(t *testing.T, n int, timeout time.Duration, drift float64) *Set {
	t.Helper()
	clients := make([]redis.UniversalClient, n)
	for i := range clients {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		clients[i] = c
		t.Cleanup(func() { c.Close(); m.Close() })
	}
	var (
		mu      sync.Mutex
		closed  bool
		wg      sync.WaitGroup
		closing = make(chan struct{})
	)
	t.Cleanup(func() {
		mu.Lock()
		closed = true
		close(closing)
		mu.Unlock()
		wg.Wait()
	})
	return NewSet(clients, Config{Timeout: timeout, Drift: drift, KeyPrefix: "lock:", ID: "test",
		Go: func(f func()) error {
			mu.Lock()
			defer mu.Unlock()
			if closed {
				return context.Canceled
			}
			wg.Go(f)
			return nil
		},
		Closing: closing,
		Invalid: func(format string, args ...any) error { return fmt.Errorf(format, args...) },
	})
}

// A Set does no I/O until a request needs a bound: the clocks are learned
// by the first one (DESIGN step 4), and every bound a request carries is
// at least the node's clock at the request's deadline (a request still
// waited for is never refused).
func TestClock_learnedOnFirstUse(t *testing.T) {
	t.Parallel()
	const drift = 0.01
	// A node timeout with room for a dial and a round trip on a loaded
	// machine.
	s := testSet(t, 3, 600*time.Millisecond, drift)
	for i := range s.Nodes {
		if clockKnown(s, i) {
			t.Fatalf("node %d's clock is known after NewSet; want no I/O", i)
		}
	}
	for i := range s.Nodes {
		// The first bound learns the clock (one probe, bounded by ctx).
		lctx, lcancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := s.notAfter(lctx, i, "") // plain nodes: no key needed
		lcancel()
		if err != nil {
			t.Fatal(err)
		}
		if !clockKnown(s, i) {
			t.Fatalf("node %d's clock is not known after notAfter", i)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		dl, _ := ctx.Deadline()
		e0 := s.Nodes[i].clock.est.Load() // a second probe may replace it meanwhile
		b, err := s.notAfter(ctx, i, "")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		// miniredis's TIME is this process's clock: the bound is the
		// deadline plus at most twice the estimate's error (the estimate
		// itself may be off by one error).
		_, err0 := e0.read(dl, drift)
		_, err1 := s.Nodes[i].clock.est.Load().read(dl, drift)
		errAt := max(err0, err1)
		if got, lo, hi := b, dl.UnixMilli(), dl.Add(2*errAt+2*time.Millisecond).UnixMilli(); got < lo || got > hi {
			t.Errorf("node %d: notAfter = %d; want in [%d, %d] (the deadline, plus the error %v)", i, got, lo, hi, errAt)
		}
	}
}

// GuardLifetime covers every bound that can still land: a node timeout and
// the clock errors for a known clock, two node timeouts and two probe
// timeouts for a node not known yet, and two TTLs once a request went out
// unbounded.
func TestClock_guardLifetime(t *testing.T) {
	t.Parallel()
	const ttl, timeout = 3 * time.Second, 100 * time.Millisecond
	s := testSet(t, 3, timeout, 0.01)
	now := time.Now()
	for i := range s.Nodes {
		// Node i's clock runs 10s ahead of ours, known within ±1ms.
		s.Nodes[i].clock.est.Store(&clockEstimate{at: now, nodeUS: now.Add(10 * time.Second).UnixMicro(), err: time.Millisecond})
	}
	g := s.guardLifetime(nil, ttl, timeout)
	// A node timeout, four clock errors (each 1ms + 1% of ≤ 100ms), the
	// margin, rounding.
	if lo, hi := timeout+4*time.Millisecond, timeout+12*time.Millisecond; g < lo || g > hi {
		t.Errorf("GuardLifetime with known clocks = %v; want in [%v, %v]", g, lo, hi)
	}
	// A bound already sent far ahead (a request from a stale estimate)
	// keeps the guard until the node's clock has passed it.
	s.Nodes[1].clock.maxBound.Store(now.Add(10*time.Second + 2*time.Second).UnixMilli())
	if g := s.guardLifetime(nil, ttl, timeout); g < 2*time.Second || g > 2*time.Second+20*time.Millisecond {
		t.Errorf("GuardLifetime with a bound 2s ahead = %v; want about 2s", g)
	}
	s.Nodes[1].clock.maxBound.Store(0)
	s.Nodes[2].clock.est.Store(nil)
	if g, want := s.guardLifetime(nil, ttl, timeout), 2*(timeout+timeout)+2*time.Millisecond; g != want {
		t.Errorf("GuardLifetime with a clock not known = %v; want %v", g, want)
	}
	s.Nodes[0].clock.unbounded.Store(true)
	if g := s.guardLifetime(nil, ttl, timeout); g != 2*ttl {
		t.Errorf("GuardLifetime after an unbounded request = %v; want %v", g, 2*ttl)
	}
}

// probeClock keeps the better estimate: a probe with a longer round trip
// does not replace a recent one that agrees with it.
func TestClock_probeKeepsTheBetterEstimate(t *testing.T) {
	t.Parallel()
	s := testSet(t, 1, time.Second, 0.01)
	now := time.Now()
	good := &clockEstimate{at: now, nodeUS: now.UnixMicro(), err: time.Nanosecond}
	s.Nodes[0].clock.est.Store(good)
	mc, probe, err := s.clockFor(t.Context(), 0, "")
	if err != nil {
		t.Fatal(err)
	}
	// Not better than an error of 1ns, and agreeing (miniredis's clock is
	// ours): kept.
	if err := s.probeClock(mc, probe); err != nil {
		t.Fatal(err)
	}
	if got := s.Nodes[0].clock.est.Load(); got != good {
		t.Errorf("estimate after a worse probe = %+v; want the better one kept", got)
	}
	// An old estimate, whose error has grown with its age: replaced.
	old := &clockEstimate{at: now.Add(-time.Hour), nodeUS: now.Add(-time.Hour).UnixMicro(), err: time.Microsecond}
	s.Nodes[0].clock.est.Store(old)
	if err := s.probeClock(mc, probe); err != nil {
		t.Fatal(err)
	}
	if got := s.Nodes[0].clock.est.Load(); got == old {
		t.Errorf("estimate after probing over an hour-old one: kept the old one; want the new one")
	}
}

// The estimate's error covers the drift over the half round trip (issue 30
// item 9): the server read its clock up to half the round trip from the
// middle, and its clock may have run drift faster meanwhile. With a drift
// factor of 0.5 and a 100ms round trip that is ≥ 75ms, not 50ms.
func TestClock_errorIncludesDriftOverTheRoundTrip(t *testing.T) {
	t.Parallel()
	const drift, rtt = 0.5, 100 * time.Millisecond
	s := testSet(t, 1, time.Second, drift)
	mc := &s.Nodes[0].clock.masterClock
	probe := clockProbe{fake: func(context.Context) (time.Time, error) {
		time.Sleep(rtt / 2)
		now := time.Now()
		time.Sleep(rtt / 2)
		return now, nil
	}}
	start := time.Now()
	if err := s.probeClock(mc, probe); err != nil {
		t.Fatal(err)
	}
	half := time.Since(start) / 2
	e := mc.est.Load()
	if lo, hi := time.Duration((1+drift)*float64(rtt/2)), time.Duration((1+drift)*float64(half))+time.Microsecond; e.err < lo || e.err > hi {
		t.Errorf("estimate error after a %v round trip = %v; want in [%v, %v]: half of it times 1+drift", rtt, e.err, lo, hi)
	}
}

// A Cluster node keeps one clock per master address, whatever the number
// of keys; past maxMasterClocks, adding a master drops the idle ones (every
// bound sent has passed on their clocks) and only those, and marks them
// dropped so that notAfter does not bound a request on them.
func TestClock_masterClocksStayBounded(t *testing.T) {
	t.Parallel()
	var nc nodeClock
	const drift = 0.01
	now := time.Now()
	busy := nc.master("busy:1", now, drift)
	busy.est.Store(&clockEstimate{at: now, nodeUS: now.UnixMicro(), err: time.Millisecond})
	busy.maxBound.Store(now.Add(time.Second).UnixMilli()) // a bound still ahead
	if nc.master("busy:1", now, drift) != busy {
		t.Fatal("master of one address twice: two clocks; want one")
	}
	idle := make([]*masterClock, 0, maxMasterClocks-1)
	for k := range maxMasterClocks - 1 {
		mc := nc.master(fmt.Sprintf("idle:%d", k), now, drift)
		mc.est.Store(&clockEstimate{at: now, nodeUS: now.UnixMicro(), err: time.Millisecond})
		mc.maxBound.Store(now.Add(-time.Second).UnixMilli()) // passed
		idle = append(idle, mc)
	}
	nc.master("new:1", now, drift)
	if n := len(nc.masters); n != 2 {
		t.Errorf("after adding a master to a full map: %d clocks; want 2 (the busy one and the new one)", n)
	}
	if busy.dropped.Load() || nc.masters["busy:1"] != busy {
		t.Error("a master with a bound still ahead was dropped")
	}
	for _, mc := range idle {
		if !mc.dropped.Load() {
			t.Fatal("an idle master dropped from the map is not marked dropped")
		}
	}
}

// clockKnown reports whether the clock of node i's server is known (on a
// Cluster node: whether the clock of any of its masters is).
func clockKnown(s *Set, i int) bool {
	nc := s.Nodes[i].clock
	if nc.est.Load() != nil {
		return true
	}
	nc.mastersMu.RLock()
	defer nc.mastersMu.RUnlock()
	for _, mc := range nc.masters {
		if mc.est.Load() != nil {
			return true
		}
	}
	return false
}
