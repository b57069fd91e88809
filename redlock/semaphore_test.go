package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

func newSemaphore(t *testing.T, c *Client, name string, k int, opts ...Option) *Semaphore {
	t.Helper()
	s, err := c.Semaphore(name, k, opts...)
	if err != nil {
		t.Fatalf("Semaphore(%q, %d) = %v", name, k, err)
	}
	return s
}

func TestSemaphore_invalid(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	cases := []struct {
		name    string
		sem     string
		permits int
		opts    []Option
	}{
		{"zero permits", "s", 0, nil},
		{"negative permits", "s", -1, nil},
		{"too many permits", "s", MaxPermits + 1, nil},
		{"empty name", "", 2, nil},
		{"reserved suffix", "s:fence", 2, nil},
		{"bad ttl", "s", 2, []Option{WithTTL(-time.Second)}},
		{"negative max hold", "s", 2, []Option{WithMaxHold(-time.Second)}},
		{"key prefix per call", "s", 2, []Option{WithKeyPrefix("x:")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Semaphore(tc.sem, tc.permits, tc.opts...)
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Semaphore(%q, %d) = %v; want ErrInvalidArgument", tc.sem, tc.permits, err)
			}
		})
	}
	s := newSemaphore(t, c, "s", 2)
	if _, err := s.TryAcquire(t.Context(), WithTTL(0)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("TryAcquire(WithTTL(0)) = %v; want ErrInvalidArgument", err)
	}
	if err := s.Do(t.Context(), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Do(nil) = %v; want ErrInvalidArgument", err)
	}
	c.Close()
	if _, err := c.Semaphore("t", 2); !errors.Is(err, ErrClosed) {
		t.Errorf("Semaphore after Close = %v; want ErrClosed", err)
	}
	if _, err := s.Acquire(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close = %v; want ErrClosed", err)
	}
}

func TestSemaphore_atMostKPermits(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	var inFlight atomic.Int64 // requests of a and b in flight on the nodes
	for _, n := range nodes {
		n.AddHook(inFlightHook{&inFlight})
	}
	// Node timeouts of 10s, 5× the slowest reply measured in the full
	// suite under -race beside stress-ng --cpu 2 at load 17-20 (2s, where
	// a 2s timeout ran out twice; miniredis runs in this process), and TTL
	// 60s to let them (the renew interval, 20s, stays above).
	const nodeTimeout = 10 * time.Second
	slack := []Option{WithTTL(time.Minute), WithNodeTimeout(nodeTimeout)}
	a := newClient(t, nodes, slack...)
	b := newClient(t, nodes, slack...)
	sa := newSemaphore(t, a, "jobs", 3)
	sb := newSemaphore(t, b, "jobs", 3)
	var held []*Lock
	seen := map[int]bool{}
	for range 3 {
		l, err := sa.TryAcquire(t.Context())
		if err != nil {
			t.Fatalf("TryAcquire = %v", err)
		}
		i := sa.Permit(l)
		if i < 0 || seen[i] {
			t.Fatalf("Permit = %d (seen %v); want a new permit in [0,3)", i, seen)
		}
		if got, want := l.Resource(), sa.PermitResource(i); got != want {
			t.Errorf("Resource() = %q; want %q", got, want)
		}
		seen[i] = true
		held = append(held, l)
	}
	if _, err := sb.TryAcquire(t.Context()); !errors.Is(err, ErrNotObtained) {
		t.Errorf("4th TryAcquire = %v; want ErrNotObtained", err)
	}
	if n, err := sb.InUse(t.Context()); n != 3 || err != nil {
		t.Errorf("InUse = %d, %v; want 3, nil", n, err)
	}
	// A ctx of 1s, and 10s when no node answered before it ended: at load
	// 17-20 none answered an attempt within 1s (ErrNoQuorum: an attempt
	// cut short by ctx tells nothing of the nodes); 10s is 5× the slowest
	// reply there. Idle, the nodes refuse within milliseconds, and 10s of
	// waiting for every run was most of this test's time.
	var err error
	for _, d := range []time.Duration{time.Second, 10 * time.Second} {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		_, err = sb.Acquire(ctx)
		cancel()
		if !errors.Is(err, ErrNoQuorum) {
			break
		}
		t.Logf("Acquire while full, ctx %v = %v: no node answered in time; again with more", d, err)
	}
	if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire while full = %v; want ErrNotObtained and DeadlineExceeded", err)
	}
	// A request of the Acquire still in flight when its ctx ended marks its
	// node as not answering until it is answered (seen once at load ~15
	// with the 1s ctx: the TryAcquire below was not sent there); the
	// in-process nodes answer it well within a node timeout.
	if !eventually(nodeTimeout, func() bool { return inFlight.Load() == 0 }) {
		t.Logf("requests still in flight %v after the Acquire gave up", nodeTimeout)
	}
	if err := held[1].Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The Acquire that gave up above leaves its queue entries to the
	// Client's background cleanup: until that lands (a loaded machine,
	// -race), a release may hand the permit to its finished token for one
	// reservation (two node timeouts). So a few tries, within that and 10s.
	var l *Lock
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if l, err = sb.TryAcquire(t.Context()); err == nil {
			break
		}
		if !errors.Is(err, ErrNotObtained) || time.Since(start) > 2*nodeTimeout+10*time.Second {
			t.Fatalf("TryAcquire after a release = %v", err)
		}
	}
	if got, want := sb.Permit(l), sa.Permit(held[1]); got != want {
		t.Errorf("permit after release = %d; want the released one, %d", got, want)
	}
	if got := sa.Permit(&Lock{lease: &lease{resource: "jobs:permit:3"}}); got != -1 {
		t.Errorf("Permit(jobs:permit:3) = %d; want -1", got)
	}
	for _, l := range append(held, l) {
		l.Unlock(context.Background())
	}
}

// attemptLog records the interval of every acquisition attempt, and what
// it was.
type attemptLog struct {
	NoHooks
	mu    sync.Mutex
	spans []span
}

func (h *attemptLog) Attempt(_ context.Context, i AttemptInfo) {
	end := time.Now()
	what := fmt.Sprintf("%s call %d: %s (granted %d, pending %d of %d) %v",
		i.Resource, i.Call, i.Outcome, i.Granted, i.Pending, i.Nodes, i.Err)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.spans = append(h.spans, span{start: end.Add(-i.Latency), end: end, what: what})
}

// since lists the attempts logged since the log was last reset, a line
// each, their times relative to t0.
func (h *attemptLog) since(t0 time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, s := range h.spans {
		fmt.Fprintf(&b, "%v–%v %s\n", s.start.Sub(t0).Round(time.Millisecond), s.end.Sub(t0).Round(time.Millisecond), s.what)
	}
	return b.String()
}

// rounds counts the waves of attempts since the log was last reset:
// attempts whose intervals overlap belong to one round trip.
func (h *attemptLog) rounds() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := slices.Clone(h.spans)
	h.spans = nil
	slices.SortFunc(ss, func(a, b span) int { return a.start.Compare(b.start) })
	n := 0
	var end time.Time
	for _, s := range ss {
		if n == 0 || s.start.After(end) {
			n++
		}
		if s.end.After(end) {
			end = s.end
		}
	}
	return n
}

// slowHook delays every request by d, so that the requests of one round
// overlap however the goroutines are scheduled.
type slowHook struct{ d time.Duration }

func (h slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(h.d)
		return next(ctx, cmd)
	}
}
func (h slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSemaphore_uncontendedRoundTrips: a free permit is one round trip, as
// a TryLock; with the first choice taken, two, whatever K.
func TestSemaphore_uncontendedRoundTrips(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	for _, n := range nodes {
		n.(*redis.Client).AddHook(slowHook{100 * time.Millisecond})
	}
	log := &attemptLog{}
	// A node timeout of 25s (TTL 90s lets it): every command here is slowed
	// by 100ms, and 5s ran out on all three in-process nodes beside
	// stress-ng --cpu 2 at load 14-17; the slowest reply measured at load
	// 17-20 was 4.1s. The test counts rounds, not time.
	c := newClient(t, nodes, WithAutoRenew(false), WithTTL(90*time.Second), WithNodeTimeout(25*time.Second), WithHooks(log))
	s := newSemaphore(t, c, "rt", 1)
	log.rounds()
	l, err := s.TryAcquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := log.rounds(); got != 1 {
		t.Errorf("uncontended TryAcquire took %d rounds; want 1", got)
	}
	l.Unlock(t.Context())

	// K=8 with 7 permits taken: two rounds, whichever permit is tried first.
	s8 := newSemaphore(t, c, "rt8", 8)
	var held []*Lock
	for range 7 {
		l, err := s8.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	for range 3 {
		log.rounds()
		l, err = s8.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := log.rounds(); got > 2 {
			t.Errorf("TryAcquire of the last free permit took %d rounds; want ≤ 2", got)
		}
		l.Unlock(t.Context())
	}
	for _, l := range held {
		l.Unlock(t.Context())
	}
}

// TestSemaphore_waitersInOrder: waiters of a full semaphore get permits in
// the order they began to wait, each within a short time of a release (a
// handoff, not the retry delay).
func TestSemaphore_waitersInOrder(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	// Long TTL and node timeout, so that a loaded machine loses no lock
	// (2s ran out on in-process nodes beside stress-ng --cpu 2 at load
	// 14-17; 10s is 5× the slowest reply measured at load 17-20, 649ms,
	// and then some); a retry delay of 40s, so that a grant within 30s of
	// a release is a handoff.
	const retryDelay, handoff = 40 * time.Second, 30 * time.Second
	opts := []Option{WithTTL(time.Minute), WithNodeTimeout(10 * time.Second), WithRetryDelay(retryDelay, retryDelay)}
	holder := newClient(t, nodes, opts...)
	sh := newSemaphore(t, holder, "line", 2, opts...)
	var held []*Lock
	for range 2 {
		l, err := sh.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	const waiters = 3
	got := make(chan int, waiters)
	grants := make(chan *Lock, waiters)
	var wg sync.WaitGroup
	for w := range waiters {
		c := newClient(t, nodes, opts...)
		s := newSemaphore(t, c, "line", 2, opts...)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 3*retryDelay)
			defer cancel()
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Errorf("waiter %d: Acquire = %v", w, err)
				got <- -1
				return
			}
			got <- w
			grants <- l
		})
		// Each one in line before the next starts.
		inLine := func() bool {
			if w == 0 { // the head: it holds the waiters' lock and waits on both permits
				return queued(t, nodes, "lock:line:permit:0", 1) && queued(t, nodes, "lock:line:permit:1", 1)
			}
			return queued(t, nodes, "lock:line:permits", w)
		}
		if !eventually(30*time.Second, inLine) {
			t.Fatalf("waiter %d did not queue", w)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var order []int
	release := func(l *Lock) {
		start := time.Now()
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case w := <-got:
			order = append(order, w)
			// A grant well before the retry delay was a handoff.
			if d := time.Since(start); d > handoff {
				t.Errorf("waiter %d got the permit %v after the release; want a handoff, well below the %v retry delay", w, d, retryDelay)
			}
		case <-time.After(2 * retryDelay):
			t.Fatalf("no waiter got the released permit")
		}
	}
	release(held[0])
	release(held[1])
	release(<-grants)
	wg.Wait()
	close(grants)
	for l := range grants {
		l.Unlock(context.Background())
	}
	if want := []int{0, 1, 2}; !slices.Equal(order, want) {
		t.Errorf("grant order = %v; want %v", order, want)
	}
}

// queued reports whether a waiter queue holds n entries on a majority of
// the nodes.
func queued(t *testing.T, nodes []redis.UniversalClient, lockKey string, n int) bool {
	t.Helper()
	// A majority, not every node: a waiter's attempt decides at a majority,
	// and on a loaded machine the request to the last node may be held
	// back (a node timed out looks down until probed) or time out; that
	// node gets the entry at a later attempt, a retry delay (5s here) on.
	got := 0
	for _, nd := range nodes {
		if c, err := nd.ZCard(context.Background(), lockKey+":queue").Result(); err == nil && c == int64(n) {
			got++
		}
	}
	return got >= len(nodes)/2+1
}

// gateHook holds a client's requests while closed: the client is paused as
// far as the nodes can tell (its renewals and releases do not arrive).
type gateHook struct {
	mu     sync.Mutex
	closed chan struct{} // nil: open
}

func (g *gateHook) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gateHook) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

func (g *gateHook) wait(ctx context.Context) error {
	g.mu.Lock()
	c := g.closed
	g.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := g.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := g.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// gatedClient is a Client over its own node clients with a gate.
func gatedClient(t *testing.T, rc *redistest.Cluster, opts ...Option) (*Client, *gateHook) {
	t.Helper()
	g := &gateHook{}
	nodes := rc.Clients()
	for _, n := range nodes {
		n.(*redis.Client).AddHook(g)
	}
	c := newClient(t, nodes, opts...)
	t.Cleanup(g.open) // before Close (cleanups run last first)
	return c, g
}

// span is one permit hold as its holder saw it: from Acquire's return to
// the earliest of Unlock and the permit's last ValidUntil (after which its
// holder has no right to act).
type span struct {
	start, end time.Time
	what       string // which permit, or which attempt (attemptLog), for a failure's message
}

// maxConcurrent returns the most spans that intersect at one instant.
func maxConcurrent(spans []span) int {
	type ev struct {
		at time.Time
		d  int
	}
	var evs []ev
	for _, s := range spans {
		evs = append(evs, ev{s.start, 1}, ev{s.end, -1})
	}
	// Ends before starts at one instant: touching spans do not overlap.
	slices.SortFunc(evs, func(a, b ev) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d
	})
	cur, most := 0, 0
	for _, e := range evs {
		cur += e.d
		most = max(most, cur)
	}
	return most
}

func TestMaxConcurrent(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	cases := []struct {
		name  string
		spans []span
		want  int
	}{
		{"none", nil, 0},
		{"disjoint", []span{{start: at(0), end: at(10)}, {start: at(20), end: at(30)}}, 1},
		{"touching", []span{{start: at(0), end: at(10)}, {start: at(10), end: at(20)}}, 1},
		{"three of four", []span{{start: at(0), end: at(50)}, {start: at(10), end: at(40)}, {start: at(20), end: at(30)}, {start: at(45), end: at(60)}}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := maxConcurrent(tc.spans); got != tc.want {
				t.Errorf("maxConcurrent = %d; want %d", got, tc.want)
			}
		})
	}
}

// TestReal_semaphoreNeverMoreThanK runs clients that take and give back
// permits of a K=2 semaphore on 5 real nodes while, in turn, two nodes are
// down (then restarted empty), a node restarts empty at once (the clients
// use WithRestartGuard), a holder pauses past its TTL, and a node is
// paused (SIGSTOP) while clients acquire; no instant may have more than K
// holders.
func TestReal_semaphoreNeverMoreThanK(t *testing.T) {
	t.Parallel()
	const k, clients = 2, 5
	// 1s, with a node timeout of 300ms, the most under its 333ms renew
	// interval (the derived 100ms was missed by rounds in the full suite
	// at load 10-20; 50ms, under -race -count=10, kept failing).
	ttl := time.Second
	rc := redistest.Start(t, 5)
	var (
		mu       sync.Mutex
		spans    []span
		failures = map[Outcome]int{}
		got      atomic.Int64
	)
	record := func(start time.Time, l *Lock, unlock time.Time) {
		end := l.ValidUntil()
		if !unlock.IsZero() && unlock.Before(end) {
			end = unlock
		}
		mu.Lock()
		spans = append(spans, span{start, end, l.Resource()})
		mu.Unlock()
		got.Add(1)
	}
	t0 := time.Now()
	// The workload runs through the faults (about 7s), then on until 10
	// permits were taken (at most 60s in all): beside stress-ng under
	// -race the first 8s once took none.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	gates := make([]*gateHook, clients)
	var wg sync.WaitGroup
	for w := range clients {
		// The restart guard: a node restarted empty at once grants nothing
		// for 2s. Without it (or a restart delayed by a TTL), a permit held
		// on exactly a majority, not yet healed onto the nodes that came back,
		// can be granted again through the restarted node: Redlock's
		// documented hazard (seen here once in about 20 runs: 3 holders).
		c, g := gatedClient(t, rc, WithTTL(ttl), WithNodeTimeout(300*time.Millisecond), WithRetryDelay(5*time.Millisecond, 20*time.Millisecond), WithRestartGuard(2*time.Second))
		gates[w] = g
		s := newSemaphore(t, c, "k2", k)
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := s.Acquire(ctx)
				start := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						failures[outcomeOf(err)]++
						mu.Unlock()
					}
					continue
				}
				if w == 0 && got.Load()%7 == 3 {
					// The holder pauses past its TTL: nothing of it reaches
					// the nodes; it is lost at ValidUntil.
					g.shut()
					select {
					case <-l.Lost():
					case <-time.After(10 * ttl):
						t.Errorf("paused holder not reported lost within 10×TTL")
					}
					time.Sleep(ttl)
					g.open()
				} else {
					time.Sleep(time.Duration(got.Load()%5) * 10 * time.Millisecond)
				}
				unlock := time.Now()
				l.Unlock(context.Background())
				record(start, l, unlock)
			}
		})
	}
	// The faults, one after another.
	var faults []string
	note := func(what string) { faults = append(faults, fmt.Sprintf("%v %s", time.Since(t0), what)) }
	time.Sleep(ttl)
	rc.Kill(3)
	rc.Kill(4)
	note("killed 3, 4")
	time.Sleep(2 * ttl)
	rc.Restart(3)
	rc.Restart(4)
	note("restarted 3, 4")
	time.Sleep(ttl) // renewals heal 3 and 4
	rc.Restart(0)   // empty, at once: a minority of any holder's nodes
	note("restarted 0")
	time.Sleep(ttl)
	rc.Pause(1) // mid-acquire
	note("paused 1")
	time.Sleep(2 * ttl)
	rc.Resume(1)
	note("resumed 1")
	for got.Load() < 10 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(spans) < 10 {
		// Twice in the full suite at load 10-20, none in 60s and no call
		// returned: what the nodes held then says why.
		t.Errorf("only %d permits taken in %v; want ≥ 10 (failed Acquire calls: %v); faults %v", len(spans), time.Since(t0).Round(time.Millisecond), failures, faults)
		dumpKeys(t, rc)
	}
	if n := maxConcurrent(spans); n > k {
		t.Errorf("%d holders at once; want ≤ %d", n, k)
		for i, a := range spans {
			for _, b := range spans[i+1:] {
				if a.start.Before(b.end) && b.start.Before(a.end) && a.what == b.what {
					t.Logf("overlap on %s: [%v, %v] and [%v, %v]", a.what, a.start.Sub(t0), a.end.Sub(t0), b.start.Sub(t0), b.end.Sub(t0))
				}
			}
		}
		t.Logf("faults: %v", faults)
	}
	t.Logf("%d permits taken; failed Acquire calls: %v", len(spans), failures)
}

// TestReal_semaphoreCrashedHolderReturnsWithinTTL: a holder of every permit
// stops (its requests never arrive: no renewal, no release); a waiter gets
// a permit within the TTL of the holder's last renewal, plus the handoff.
func TestReal_semaphoreCrashedHolderReturnsWithinTTL(t *testing.T) {
	t.Parallel()
	ttl := time.Second
	rc := redistest.Start(t, 3)
	a, g := gatedClient(t, rc, WithTTL(ttl))
	// The waiter's own TTL is not what is measured: 30s gives its fresh
	// Client a 1s node timeout (at 100ms its first requests, after the
	// crash, can miss it under load; issue 31), and puts a wait for it far
	// beyond the bound below.
	attempts := &attemptLog{}
	b := newClient(t, rc.Clients(), WithTTL(30*time.Second), WithHooks(attempts))
	sa, sb := newSemaphore(t, a, "crash", 2), newSemaphore(t, b, "crash", 2)
	for range 2 {
		// Acquire, not TryAcquire: a first request on a loaded machine
		// may miss the 100ms node timeout while it dials.
		if _, err := sa.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	g.shut()
	crash := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := sb.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after the holder crashed = %v", err)
	}
	waited := time.Since(crash)
	// The keys die within a TTL of the holder's last renewal; expiry sends
	// no message, so the waiter sees it at its next attempt, within a retry
	// delay (at most 250ms): about 1.25s on a quiet machine. Before it, the
	// waiter's fresh Client makes about eight requests one after another
	// (its first TryAcquire, the waiters' lock, the second TryAcquire,
	// subscribing for wake-ups, its queued attempts), each of which a
	// loaded machine can hold up to its 1s node timeout: 6.25s (5× the
	// quiet figure) was exceeded once, at 7.5s, in a .ci/stress run whose
	// builds ran cold beside the tests (cmd/qlock's tests took 6× their
	// usual time). The bound is 1.25s plus ten node timeouts plus 3.75s:
	// 15s, 2× that figure, and half the waiter's own TTL, so that a
	// waiter that waits for its own TTL (30s), or for a wake-up that
	// expiry never sends, still fails. The attempts are logged.
	if limit := ttl + DefaultRetryDelayMax + 10*time.Second + 3750*time.Millisecond; waited > limit {
		t.Errorf("permit returned %v after the crash; want ≤ %v; the waiter's attempts, from the crash:\n%s", waited, limit, attempts.since(crash))
	}
	t.Logf("permit returned %v after the crash (TTL %v)", waited, ttl)
	l.Unlock(t.Context())
}
