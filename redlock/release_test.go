package redlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// Tests of DESIGN step 4 as issue 21 states it: a call returns once its
// outcome is decided, and the Client finishes the releases in the
// background.

// callBound is how long a call that must not wait for a paused node may
// take: the nodes answer in well under a millisecond (843µs for TryLock
// with all nodes up on main), and 100ms is the bound: the slowest
// of 10 tries took 1.5–6ms idle and under -race. At load 12–16 on 2 cores
// one try in 30 took 168ms (the process was not scheduled), so each try
// must stay within stallBound, half the node timeout (a call that waits
// for the paused node takes the whole second), and the median within
// callBound.
const (
	callBound  = 100 * time.Millisecond
	stallBound = 500 * time.Millisecond
)

// checkCallTimes checks the times of calls that must not wait for a paused
// node (see callBound), and logs them.
func checkCallTimes(t *testing.T, what string, took []time.Duration) {
	t.Helper()
	sorted := slices.Clone(took)
	slices.Sort(sorted)
	over := 0
	for i, d := range took {
		if d > callBound {
			over++
		}
		if d > stallBound {
			t.Errorf("%s %d took %v; want at most %v (the paused node is not waited for)", what, i, d, stallBound)
		}
	}
	if med := sorted[len(sorted)/2]; med > callBound {
		t.Errorf("%s: median %v; want at most %v", what, med, callBound)
	}
	t.Logf("%d %s calls with 1 of 3 nodes paused: median %v, slowest %v, %d over %v", len(took), what, sorted[len(sorted)/2], sorted[len(sorted)-1], over, callBound)
}

// A failed TryLock's cleanup on a paused node is the Client's: the caller
// gets ErrNotObtained once two refusals made a majority impossible, not
// after the node timeout (1.001s on main, 3 of 3 tries).
//
// Not parallel: this package's parallel tests loading the machine took
// tries to 260ms under -race (see callBound).
func TestReal_tryLockOfAHeldLockAnswersDespiteAPausedNode(t *testing.T) {
	rc := redistest.Start(t, 3)
	holder := bystander(t, rc.Clients()) // it sets up the key c is refused on
	c := newClient(t, rc.Clients(), WithNodeTimeout(time.Second))
	hl, err := holder.Lock(t.Context(), "held")
	if err != nil {
		t.Fatal(err)
	}
	// The key must be on both live nodes. Under load the holder's first
	// request to one node may land past its not-after bound and set
	// nothing there (the lock then sits on 2 of 3 until its first
	// renewal): every try was then granted there and failed on the paused
	// node beside stress-ng. Extend heals it, each within the holder's node
	// timeout: three of them.
	if !eventually(3*bystanderNodeTimeout, func() bool {
		if holders(t, rc, "lock:held", hl.Token()) == 3 {
			return true
		}
		_ = hl.Extend(t.Context())
		return false
	}) {
		t.Fatalf("the holder's key is on %d of 3 nodes after %v of Extends", holders(t, rc, "lock:held", hl.Token()), 3*bystanderNodeTimeout)
	}
	// Warm c's connections, so that no try pays for a dial.
	if l, err := c.TryLock(t.Context(), "warm"); err == nil {
		l.Unlock(t.Context())
	}
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(2) })
	var took []time.Duration
	for try := range 10 {
		start := time.Now()
		_, err := c.TryLock(t.Context(), "held")
		took = append(took, time.Since(start))
		if !errors.Is(err, ErrNotObtained) {
			t.Errorf("try %d: TryLock = %v; want ErrNotObtained", try, err)
		}
	}
	checkCallTimes(t, "TryLock", took)
}

// Unlock returns once a majority confirmed (1s, the node timeout, on main),
// and the key leaves the paused node once it resumes: the Client's retry
// loop sends it the release again.
//
// Not parallel, as the TryLock test above.
func TestReal_unlockReturnsDespiteAPausedNodeAndReleasesItLater(t *testing.T) {
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithNodeTimeout(time.Second))
	const trials = 10
	locks := make([]*Lock, trials)
	for j := range locks {
		l, err := c.Lock(t.Context(), fmt.Sprint("u", j))
		if err != nil {
			t.Fatal(err)
		}
		locks[j] = l
	}
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(2) })
	var took []time.Duration
	for j, l := range locks {
		start := time.Now()
		err := l.Unlock(t.Context())
		took = append(took, time.Since(start))
		if err != nil {
			t.Errorf("Unlock %d with 1 of 3 paused = %v; want nil", j, err)
		}
	}
	checkCallTimes(t, "Unlock", took)
	// Paused through a few of the loop's rounds (each waits the node
	// timeout), then resumed.
	time.Sleep(2500 * time.Millisecond)
	for j, l := range locks {
		if keyOn(t, rc, 0, "lock:u"+strconv.Itoa(j)) != "" {
			t.Errorf("node 0 keeps lock %d", j)
		}
		_ = l
	}
	rc.Resume(2)
	// The loop's next round comes within retryMax (1s) and the node
	// timeout; 10s is over 5× that.
	for j, l := range locks {
		key := "lock:u" + strconv.Itoa(j)
		if !eventually(10*time.Second, func() bool { return keyOn(t, rc, 2, key) != l.Token() }) {
			t.Errorf("node 2 keeps lock %d's key after it resumed", j)
		}
	}
	if !eventually(10*time.Second, func() bool { return c.rel.pending(2) == 0 }) {
		t.Errorf("node 2 still has %d releases pending after it resumed", c.rel.pending(2))
	}
}

// goroutinesWithin waits up to d for the number of goroutines to fall to
// at most limit, and returns the last count.
func goroutinesWithin(d time.Duration, limit int) int {
	n := runtime.NumGoroutine()
	eventually(d, func() bool { n = runtime.NumGoroutine(); return n <= limit })
	return n
}

// 300 Lock+Unlock with a node killed start no goroutine per release (on
// main: 8 → 339 goroutines, still 321 eight seconds later, and 4,463
// requests to the dead node in the next second). The node clients reach
// the servers directly, so a killed node refuses the dial: those requests
// never left the client, and no release is pending for it.
func TestReal_releasesWithAKilledNodeStayBounded(t *testing.T) {
	rc := redistest.Start(t, 3)
	direct := oneDialClients(t, rc)
	var sent atomic.Int64
	direct[2].AddHook(countingHook{&sent})
	// TTL 10s for the derived 1s node timeout: 300 Unlocks must each hear
	// both live nodes, and 100ms (TTL 1s) is no slack under load (issue 31).
	c := newClient(t, direct, WithTTL(10*time.Second))
	// Warm up: the workers and connections a Lock+Unlock needs.
	l, err := c.Lock(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock(t.Context())
	g0 := runtime.NumGoroutine()
	rc.Kill(2)
	for j := range 300 {
		l, err := c.Lock(t.Context(), "k"+strconv.Itoa(j%10))
		if err != nil {
			t.Fatalf("Lock %d with 1 of 3 killed = %v", j, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("Unlock %d with 1 of 3 killed = %v", j, err)
		}
	}
	time.Sleep(time.Second)
	if n := goroutinesWithin(5*time.Second, g0+50); n > g0+50 {
		t.Errorf("goroutines: %d before, %d a second after 300 Lock+Unlock with a killed node; want at most 50 more", g0, n)
		buf := make([]byte, 1<<20)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
	}
	// Only requests sent on connections pooled before the kill, or in
	// flight at it (the warm-up's release to node 2: Unlock returns at a
	// majority), may have left the client: a few, not one per Unlock (300).
	// How many depends on what ran at once before the kill (clock and
	// identity probes beside the warm-up): 0-4 in 7 runs at load ~15, 9 under
	// stress-ng at load 17 (.ci/stress on c548866, where the bound was 5);
	// 45 is 5× that, and under a sixth of the Unlocks.
	if n := c.rel.pending(2); n > 45 {
		t.Errorf("%d releases pending for the killed node; want at most 45 (no request of ours left the client once the node was known down)", n)
	}
	s0 := sent.Load()
	time.Sleep(time.Second)
	if n := sent.Load() - s0; n > 5 {
		t.Errorf("%d requests to the killed node in the second after; want at most 5", n)
	}
	t.Logf("goroutines %d before, %d after; pending %d", g0, runtime.NumGoroutine(), c.rel.pending(2))
}

// oneDialClients returns clients that reach the servers directly and dial
// once per request (MaxRetries -1, DialerRetries 1), so that a killed node's requests fail
// at once with the refused dial. (With go-redis's default retries a
// request to a dead node sleeps between dials until its ctx ends, and
// reports ctx's error; a Client that knows the node is down answers such
// requests at once.)
func oneDialClients(t *testing.T, rc *redistest.Cluster) []redis.UniversalClient {
	t.Helper()
	var out []redis.UniversalClient
	for i := range rc.N() {
		cl := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { cl.Close() })
		out = append(out, cl)
	}
	return out
}

// idleWorkers is how many idle goroutines a Client's quorum.Workers keeps
// for reuse (its maxIdle): requests that wait for a paused node hold a
// worker each for the node timeout, and the workers stay parked after.
const idleWorkers = 256

// With a node paused, the releases pending for it are one entry per
// Unlock, sent by one loop in one pipeline at a time: in flight on the
// node, at most the loop's request (and stragglers of the last node
// timeout); when it resumes, they all go.
func TestReal_releasesWithAPausedNodeStayBounded(t *testing.T) {
	rc := redistest.Start(t, 3)
	// Directly to the servers: the proxies' goroutines would count too.
	nodes := directClients(t, rc)
	var sent, inFlight atomic.Int64
	nodes[2].AddHook(countingHook{&sent})
	nodes[2].AddHook(inFlightHook{&inFlight})
	// TTL 3s: node timeout 300ms, so stragglers time out soon (with
	// 100ms, healthy nodes missed it under load).
	c := newClient(t, nodes, WithTTL(3*time.Second))
	l, err := c.Lock(t.Context(), "p")
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock(t.Context())
	g0 := runtime.NumGoroutine()
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(2) })
	const k = 300
	tokens := make(map[string]string, k)
	for j := range k {
		res := "p" + strconv.Itoa(j)
		l, err := c.Lock(t.Context(), res)
		if err != nil {
			t.Fatalf("Lock %d with 1 of 3 paused = %v", j, err)
		}
		tokens[res] = l.Token()
		if err := l.Unlock(t.Context()); err != nil && !errors.Is(err, ErrNoQuorum) {
			t.Fatalf("Unlock %d with 1 of 3 paused = %v", j, err)
		} else if err != nil {
			t.Logf("Unlock %d with 1 of 3 paused = %.80v (a loaded machine)", j, err)
		}
	}
	time.Sleep(time.Second)
	if n := goroutinesWithin(5*time.Second, g0+idleWorkers+50); n > g0+idleWorkers+50 {
		t.Errorf("goroutines: %d before, %d a second after; want at most %d more (idle workers and 50)", g0, n, idleWorkers+50)
	}
	// One per Unlock, and one per failed attempt of a Lock call (a
	// loaded machine times some out).
	if n := c.rel.pending(2); n > 2*k {
		t.Errorf("%d releases pending for the paused node; want at most %d", n, 2*k)
	}
	if n := inFlight.Load(); n > 2 {
		t.Errorf("%d requests in flight on the paused node a second after; want the retry loop's only", n)
	}
	s0 := sent.Load()
	time.Sleep(time.Second)
	// One pipeline per round; rounds at most every node timeout (300ms).
	if n := sent.Load() - s0; n > 5 {
		t.Errorf("%d requests to the paused node in a second; want at most 5 (one pipeline per round)", n)
	}
	t.Logf("goroutines %d before, %d after; pending %d, in flight %d, requests in a second %d",
		g0, runtime.NumGoroutine(), c.rel.pending(2), inFlight.Load(), sent.Load()-s0)
	rc.Resume(2)
	if !eventually(10*time.Second, func() bool { return c.rel.pending(2) == 0 }) {
		t.Errorf("%d releases still pending after the node resumed", c.rel.pending(2))
	}
	for res, tok := range tokens {
		if keyOn(t, rc, 2, "lock:"+res) == tok {
			t.Errorf("node 2 keeps %s after it resumed", res)
		}
	}
}

// countingHook counts the requests (commands and pipelines) sent to a node.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// inFlightHook counts the requests (a pipeline is one) in flight on a node.
type inFlightHook struct{ n *atomic.Int64 }

func (h inFlightHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h inFlightHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		defer h.n.Add(-1)
		return next(ctx, cmd)
	}
}
func (h inFlightHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		defer h.n.Add(-1)
		return next(ctx, cmds)
	}
}

// lockKeys counts the lock keys under prefix on node i (not guards, queues
// or fence counters).
func lockKeys(t *testing.T, rc *redistest.Cluster, i int, prefix string) int {
	t.Helper()
	n := 0
	iter := rc.Admin(i).Scan(context.Background(), 0, prefix+"*", 10000).Iterator()
	for iter.Next(context.Background()) {
		k := iter.Val()
		if !strings.Contains(k, ":released:") && !strings.HasSuffix(k, ":queue") && !strings.HasSuffix(k, ":fence") {
			n++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN node %d: %v", i, err)
	}
	return n
}

// closeLocks is how many locks the Close tests hold: QUORUMLOCK_CLOSE_LOCKS
// (e.g. 100000), else def.
func closeLocks(t *testing.T, def int) int {
	t.Helper()
	s := os.Getenv("QUORUMLOCK_CLOSE_LOCKS")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("QUORUMLOCK_CLOSE_LOCKS=%q: want a positive number", s)
	}
	return n
}

// holdMany acquires k locks "many:<j>" on c with 16 goroutines.
func holdMany(t *testing.T, c *Client, k int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int32
	for g := range 16 {
		wg.Go(func() {
			for j := g; j < k; j += 16 {
				if _, err := c.Lock(ctx, "many:"+strconv.Itoa(j)); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d Lock calls failed", n, k)
	}
	t.Logf("%d locks acquired in %v", k, time.Since(start).Round(time.Millisecond))
}

// Close on healthy nodes finishes the work they are doing: every lock is
// released whatever their number (on main, 86,129 of 150,000 keys of 30,000
// locks stayed). With QUORUMLOCK_CLOSE_LOCKS=100000 this is the issue's
// run.
func TestReal_closeReleasesEveryLockOnHealthyNodes(t *testing.T) {
	t.Parallel()
	k := closeLocks(t, 5000)
	rc := redistest.Start(t, 5)
	// A node timeout of 5s: the releases of 5,000 locks go to a node in
	// pipelined batches, and at load 7 this test once failed with a 1s
	// node timeout (Close gives up a node that does not answer within it;
	// its keys then expire with their TTL). What it checks is that
	// healthy nodes keep none.
	c, err := New(rc.Clients(), WithTTL(time.Minute), WithNodeTimeout(5*time.Second), WithWakeUp(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holdMany(t, c, k)
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Errorf("Close = %.1500v; want nil", err)
	}
	t.Logf("Close of %d locks on 5 healthy nodes: %v", k, time.Since(start).Round(time.Millisecond))
	for i := range 5 {
		if n := lockKeys(t, rc, i, "lock:many:"); n != 0 {
			t.Errorf("node %d keeps %d of %d lock keys after Close", i, n, k)
		}
	}
}
