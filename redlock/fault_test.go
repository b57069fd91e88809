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
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/scripts"
)

// Tests in this file run against real redis-server processes, for faults
// miniredis cannot show: kill, SIGSTOP, restart, latency.

// keyOn returns the token that key holds on node i, read directly from the
// server, or "" when it is absent.
func keyOn(t *testing.T, rc *redistest.Cluster, i int, key string) string {
	t.Helper()
	v, err := rc.Admin(i).Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatalf("GET %s on node %d: %v", key, i, err)
	}
	return v
}

// holders counts the nodes whose key holds token.
func holders(t *testing.T, rc *redistest.Cluster, key, token string) int {
	t.Helper()
	n := 0
	for i := range rc.N() {
		if keyOn(t, rc, i, key) == token {
			n++
		}
	}
	return n
}

// directClients returns clients that reach the servers directly, bypassing
// the proxies (whose latency or cuts then affect other clients only).
func directClients(t testing.TB, rc *redistest.Cluster) []redis.UniversalClient {
	t.Helper()
	var direct []redis.UniversalClient
	for i := range rc.N() {
		cl := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: true})
		t.Cleanup(func() { cl.Close() })
		direct = append(direct, cl)
	}
	return direct
}

// noLockKey reports whether, within d, no node holds key for any token.
func noLockKey(t *testing.T, rc *redistest.Cluster, key string, d time.Duration) bool {
	t.Helper()
	return eventually(d, func() bool {
		for i := range rc.N() {
			if keyOn(t, rc, i, key) != "" {
				return false
			}
		}
		return true
	})
}

// eventually polls cond every 5ms until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// warmUp makes c dial its nodes and learn their identities and clocks
// before a test slows them down: a TryLock and Unlock of the resource
// "warm", tried again until one succeeds, for up to 30s (a fresh Client's
// first requests do their dial and handshake inside the node timeout, and
// beside stress-ng at load 16–22 a first try missed it on two nodes).
func warmUp(t *testing.T, c *Client, opts ...Option) {
	t.Helper()
	var err error
	if !eventually(30*time.Second, func() bool {
		var l *Lock
		if l, err = c.TryLock(t.Context(), "warm", opts...); err != nil {
			return false
		}
		_ = l.Unlock(t.Context())
		return true
	}) {
		t.Fatalf("warm-up TryLock for 30s: %v", err)
	}
}

func TestReal_exclusionBetweenClients(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := bystander(t, rc.Clients()) // it checks: a refusal, then the free lock
	l, err := a.Lock(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(t.Context(), "x"); !errors.Is(err, ErrNotObtained) {
		t.Errorf("second client TryLock = %v; want ErrNotObtained", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l2, err := b.TryLock(t.Context(), "x")
	if err != nil {
		t.Fatalf("TryLock after Unlock = %v", err)
	}
	l2.Unlock(t.Context())
}

func TestReal_minorityKilledStillAcquires(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	rc.Kill(0)
	rc.Kill(3)
	l, err := c.TryLock(t.Context(), "m")
	if err != nil {
		t.Fatalf("TryLock with 2 of 5 down = %v; want success", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock with 2 of 5 down = %v; want nil", err)
	}
}

func TestReal_majorityDownFailsFastWithNodeErrors(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	for _, i := range []int{1, 2, 4} {
		rc.Kill(i)
	}
	start := time.Now()
	_, err := c.TryLock(t.Context(), "m")
	took := time.Since(start)
	var ne *NodeError
	if !errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotObtained) || !errors.As(err, &ne) {
		t.Fatalf("TryLock with 3 of 5 down = %v; want ErrNoQuorum with *NodeError, not ErrNotObtained", err)
	}
	var failed []int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if errors.As(e, &ne) {
			failed = append(failed, ne.Node)
		}
	}
	slices.Sort(failed)
	if !slices.Equal(failed, []int{1, 2, 4}) {
		t.Errorf("node errors name nodes %v; want [1 2 4]", failed)
	}
	// Refused connections answer at once: no node timeout (1s) is waited.
	if took > 500*time.Millisecond {
		t.Errorf("TryLock took %v with refused connections; want a fast failure", took)
	}
}

func TestReal_evenNNeedsThreeOfFour(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 4)
	c := newClient(t, rc.Clients())
	rc.Kill(0)
	rc.Kill(1)
	if _, err := c.TryLock(t.Context(), "even"); !errors.Is(err, ErrNoQuorum) {
		t.Errorf("TryLock with 2 of 4 up = %v; want ErrNoQuorum", err)
	}
	rc.Restart(1)
	l, err := c.TryLock(t.Context(), "even")
	if err != nil {
		t.Fatalf("TryLock with 3 of 4 up = %v; want success", err)
	}
	l.Unlock(t.Context())
}

// go-redsync v4.18.1 leaves its key on nodes when the caller's ctx expires
// mid-acquire, because its release reuses the dead ctx. Ours must not.
func TestReal_ctxExpiresMidAcquireLeavesNoKey(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	for i := range 5 {
		rc.SetLatency(i, 40*time.Millisecond) // requests land after ctx ends
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Lock(ctx, "slow")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v; want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Lock returned %v after a 30ms ctx; want promptly", took)
	}
	if !noLockKey(t, rc, "lock:slow", 3*time.Second) {
		t.Errorf("a key is left on a node after the cancelled attempt")
	}
}

func TestReal_ctxCancelledWhileContending(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	rounds := &roundCounter{}
	b := newClient(t, rc.Clients(), WithHooks(rounds))
	held, err := a.Lock(t.Context(), "busy")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	// Cancelled once the waiter has been refused at least once (a loaded
	// machine can take longer than a fixed 150ms for its first round, and
	// an attempt cut short says nothing about the nodes).
	go func() {
		eventually(20*time.Second, func() bool { return rounds.rounds.Load() > 0 })
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	_, err = b.Lock(ctx, "busy")
	cancelled := time.Now()
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotObtained) {
		t.Errorf("Lock = %v; want ErrNotObtained joined with context.Canceled", err)
	}
	if took := time.Since(cancelled); took > 400*time.Millisecond {
		t.Errorf("Lock returned %v after cancel; want promptly", took)
	}
	// The waiter's releases never touch the holder's key; an extension heals
	// a node the waiter may have reached first, once the waiter's release
	// (in the background: its ctx was cancelled) has freed it there.
	if !eventually(5*time.Second, func() bool {
		if err := held.Extend(t.Context()); err != nil {
			t.Fatal(err)
		}
		return holders(t, rc, "lock:busy", held.Token()) == 5
	}) {
		t.Errorf("holder's key on %d nodes after the waiter gave up; want 5", holders(t, rc, "lock:busy", held.Token()))
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Unlock returns once a majority released; the rest follow at once.
	for i := range 5 {
		if !eventually(time.Second, func() bool { return keyOn(t, rc, i, "lock:busy") == "" }) {
			t.Errorf("node %d keeps %q; want no key of the waiter", i, keyOn(t, rc, i, "lock:busy"))
		}
	}
}

func TestReal_partialGrantReleasedBeforeReturn(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	// A node timeout of 9s (under the 10s renew interval of the default
	// TTL): this new Client's first requests missed the default 1s on 3
	// of 5 nodes beside stress-ng --cpu 2 at load 14-17; the slowest first
	// round trips measured in this package at load 17-20 took about 1.2s
	// (a reconnection's HELLO).
	c := newClient(t, rc.Clients(), WithNodeTimeout(9*time.Second))
	for i := range 3 {
		rc.Admin(i).Set(t.Context(), "lock:part", "foreign", time.Minute)
	}
	_, err := c.TryLock(t.Context(), "part")
	if !errors.Is(err, ErrNotObtained) {
		t.Fatalf("TryLock = %v; want ErrNotObtained", err)
	}
	// The two nodes that granted are released by the Client, which sent
	// the releases before TryLock returned (step 4): a round trip later,
	// waited for with 5× the slowest round trip.
	for i := 3; i < 5; i++ {
		if !eventually(6*time.Second, func() bool { return keyOn(t, rc, i, "lock:part") == "" }) {
			t.Errorf("node %d keeps our key %q after TryLock returned", i, keyOn(t, rc, i, "lock:part"))
		}
	}
	for i := range 3 {
		if v := keyOn(t, rc, i, "lock:part"); v != "foreign" {
			t.Errorf("node %d: foreign key became %q", i, v)
		}
	}
}

func TestReal_slowNodeNotWaitedFor(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	// Warm up connections, then slow one node down.
	warmUp(t, c)
	// 1s each way: waiting for the node costs at least 2s. The TryLock
	// takes ~1-3ms quiet and took 159ms once beside stress-ng (.ci/stress
	// run 2 on 40b7fce, against a bound of 150ms with 300ms each way):
	// 1s is 6× that and half the slow node's round trip.
	rc.SetLatency(2, time.Second)
	start := time.Now()
	l, err := c.TryLock(t.Context(), "fast")
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if took > time.Second {
		t.Errorf("TryLock took %v with one node +1s each way; want it not to wait for that node", took)
	}
	l.Unlock(t.Context())
}

func TestReal_scriptFlush(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	l, err := c.Lock(t.Context(), "sf")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := rc.Admin(i).ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Extend(t.Context()); err != nil {
		t.Errorf("Extend after SCRIPT FLUSH = %v", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock after SCRIPT FLUSH = %v", err)
	}
	if l, err = c.TryLock(t.Context(), "sf"); err != nil {
		t.Errorf("TryLock after SCRIPT FLUSH = %v", err)
	}
	l.Unlock(t.Context())
}

func TestReal_expiredUnlockSparesNextHolder(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := bystander(t, rc.Clients()) // the next holder, whose key a's stale Unlock must spare
	// The default node timeout of a 200ms TTL, 20ms, was missed under
	// -race on a loaded machine (by all 5 nodes at once in one run), and
	// then 150ms (a 600ms TTL), by the stale Unlock on 3 of 5 nodes beside
	// stress-ng --cpu 2 at load 14-17. 900ms is 10× the slowest reply
	// measured at load 17-20 (91ms); TTL 3s lets it.
	old, err := a.Lock(t.Context(), "exp", WithTTL(3*time.Second), WithAutoRenew(false), WithNodeTimeout(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-old.Lost()
	// Lost fires at ValidUntil, a drift allowance before the nodes expire
	// the key: wait until they have.
	if !eventually(5*time.Second, func() bool { return holders(t, rc, "lock:exp", old.Token()) == 0 }) {
		t.Fatal("the expired lock's key is still on a node")
	}
	next, err := b.Lock(t.Context(), "exp", WithRetryDelay(10*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Extend decides at a majority; the others answer a moment later.
	if !eventually(5*time.Second, func() bool {
		return next.Extend(t.Context()) == nil && holders(t, rc, "lock:exp", next.Token()) == 5
	}) {
		t.Fatal("the next holder's key is not on every node")
	}
	if err := old.Unlock(t.Context()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Unlock of an expired lock = %v; want ErrNotHeld", err)
	}
	if n := holders(t, rc, "lock:exp", next.Token()); n != 5 {
		t.Errorf("next holder's key on %d of 5 nodes after the stale Unlock; want 5 (untouched)", n)
	}
	next.Unlock(t.Context())
}

// --- the watchdog (DESIGN step 7) ---

func TestReal_renewedBeyondTTL(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := bystander(t, rc.Clients()) // it checks the lock stays taken
	// TTL 3s, node timeout 900ms, renewals every 1s: with 600ms (a 60ms
	// node timeout, renewals every 200ms) the lock ran out after 783ms in
	// one loaded -race run, and with 1.5s (150ms) its Unlock found no
	// majority within the node timeout at load 15–25 (3 of 4 full runs
	// beside stress-ng --cpu 2). 6s is two TTLs.
	ttl := 3 * time.Second
	l, err := a.Lock(t.Context(), "long", WithTTL(ttl), WithNodeTimeout(900*time.Millisecond), WithRenewInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(2 * ttl)
	for time.Now().Before(end) {
		if !l.Valid() {
			t.Fatalf("lock invalid after %v", 2*ttl-time.Until(end))
		}
		if _, err := b.TryLock(t.Context(), "long"); !errors.Is(err, ErrNotObtained) {
			t.Fatalf("other client TryLock = %v; want ErrNotObtained", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	positive := 0
	for i := range 5 {
		if d := rc.Admin(i).PTTL(t.Context(), "lock:long").Val(); d > 0 {
			positive++
		}
	}
	if positive < 3 {
		t.Errorf("positive PTTL on %d nodes; want a majority", positive)
	}
	select {
	case <-l.Lost():
		t.Errorf("lock reported lost on healthy nodes")
	default:
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// lossTrials is how many times TestReal_pauseMajorityLossBeforeValidity
// repeats, and how late after ValidUntil a loss report may come.
// QUORUMLOCK_LOSS_TRIALS sets the trials for a longer profile, on a quiet
// machine, and with it the strict allowance of 50ms: a loss detection that
// waited for a hung node would be late by a whole node timeout (50ms) plus
// retries.
//
// By default the allowance is 1s, for `go test ./...` on a loaded machine:
// the contract is "Lost at ValidUntil at the latest, give or take
// scheduling delay", and on 2 cores at load 12–21 under -race the renewal
// scheduler's timer goroutine itself runs late: measured up to 89ms after
// ValidUntil in 60 trials at load 21, while a 5ms sleep in the test
// overran by up to 246ms (printed beside the figures); the failure that
// led here reported a loss 708ms after the pause with a 500ms TTL, about
// 200ms late. 1s is 5× that. It still fails a loss that waits for the
// hung renewals to give up (they never do while the nodes are paused: only
// the 5×TTL bound below ends that), or one that waits for several renewal
// intervals (166ms each).
func lossTrials() (trials int, allowance time.Duration) {
	if n, err := strconv.Atoi(os.Getenv("QUORUMLOCK_LOSS_TRIALS")); err == nil && n > 0 {
		return n, 50 * time.Millisecond
	}
	return 15, time.Second
}

// stacksMatching returns the stacks of the goroutines whose stack mentions
// any of subs, for a failure message.
func stacksMatching(subs ...string) string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, sub := range subs {
			if strings.Contains(g, sub) {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

// oversleep reports, until stop is closed, the longest time by which a 5ms
// sleep overran: the scheduling delay of the machine at that moment. It
// also keeps in st what a trial asks on failure: whether the process
// stalled during it.
func oversleep(stop <-chan struct{}, st *stall) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		var worst time.Duration
		for {
			select {
			case <-stop:
				out <- worst
				return
			default:
			}
			start := time.Now()
			time.Sleep(5 * time.Millisecond)
			over := time.Since(start) - 5*time.Millisecond
			worst = max(worst, over)
			for {
				cur := st.worst.Load()
				if int64(over) <= cur || st.worst.CompareAndSwap(cur, int64(over)) {
					break
				}
			}
			st.rounds.Add(1)
		}
	}()
	return out
}

// stall is what oversleep saw since a trial began.
type stall struct {
	worst  atomic.Int64 // the longest overrun of a 5ms sleep since the trial stored 0, in ns
	rounds atomic.Int64 // sleeps measured
}

// since returns the longest overrun since the trial stored 0, once a sleep
// begun after the call has been measured (the one under way when the
// process stalled ends only after the stall), or after a second.
func (st *stall) since() time.Duration {
	n := st.rounds.Load()
	eventually(time.Second, func() bool { return st.rounds.Load() >= n+2 })
	return time.Duration(st.worst.Load())
}

// Not parallel: it measures timing, so it runs before this package's
// parallel tests start.
func TestReal_pauseMajorityLossBeforeValidity(t *testing.T) {
	const ttl = 500 * time.Millisecond
	trials, allowance := lossTrials()
	stopProbe := make(chan struct{})
	var stalled stall
	probe := oversleep(stopProbe, &stalled)
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	var (
		late, void  int             // loss reports late; trials void (the process stalled)
		toLost      []time.Duration // from pausing the majority to Lost()
		beforeValid []time.Duration // how long before ValidUntil the loss was reported (negative: after)
	)
	for trial := range trials {
		var onLost atomic.Int32
		l, err := c.Lock(t.Context(), "p", WithTTL(ttl), WithOnLost(func(*Lock, error) { onLost.Add(1) }))
		if err != nil {
			t.Fatalf("trial %d: Lock = %v", trial, err)
		}
		// Pause at a random point of the renewal cycle.
		time.Sleep(time.Duration(trial*37%150) * time.Millisecond)
		stalled.worst.Store(0)
		paused := time.Now()
		for _, i := range []int{0, 2, 4} {
			rc.Pause(i)
		}
		var lostAt time.Time
		select {
		case <-l.Lost():
			lostAt = time.Now()
		case <-time.After(5 * ttl):
			// Seen once in a package run on a lightly loaded machine, not
			// reproduced in 50 runs alone nor 15 beside two busy loops:
			// say what the lock and the renewal scheduler were doing.
			l.mu.Lock()
			st, until, watched, handle := l.state, time.Until(l.validUntil), l.watched, l.handle != nil
			l.mu.Unlock()
			stacks := stacksMatching("quorumlock/renew", "redlock.(*Lock)", "redlock.watch")
			// A process stalled (descheduled, its VM paused) past both the
			// deadline and this timer wakes with both due, and the timer's
			// send completes this select before the renewal loop has run
			// (reproduced by stopping the test process for 3s with SIGSTOP
			// after the pause: this path, Lost closed some µs later). When
			// Lost closes, and the probe's overrun, tell that apart from a
			// loop that never reports (below: late, or void).
			timedOut := time.Now()
			select {
			case <-l.Lost():
				lostAt = time.Now()
				t.Logf("trial %d: not lost %v after pausing 3 of 5; closed %v after the timer was taken (state %d, ValidUntil in %v, watched %v, renewal handle %v then); goroutines of the renewal and the lock then:\n%s",
					trial, 5*ttl, lostAt.Sub(timedOut), st, until, watched, handle, stacks)
			case <-time.After(time.Second):
				t.Fatalf("trial %d: not lost %v after pausing 3 of 5, nor 1s later (state %d, ValidUntil in %v, watched %v, renewal handle %v; a 5ms sleep overran by up to %v during this trial); goroutines of the renewal and the lock:\n%s",
					trial, 5*ttl, st, until, watched, handle, stalled.since(), stacks)
			}
		}
		until := l.ValidUntil()
		switch over := lostAt.Sub(until) - allowance; {
		case over <= 0:
			toLost = append(toLost, lostAt.Sub(paused))
			beforeValid = append(beforeValid, until.Sub(lostAt))
		case stalled.since() >= over:
			// The whole process stalled at least as long as the report
			// is late: the renewal loop's timer, which this test is
			// about, could not run; the trial measures nothing.
			void++
			t.Logf("trial %d void: Lost %v after ValidUntil, and the process stalled meanwhile (a 5ms sleep overran by up to %v)",
				trial, lostAt.Sub(until), time.Duration(stalled.worst.Load()))
		default:
			late++
			toLost = append(toLost, lostAt.Sub(paused))
			beforeValid = append(beforeValid, until.Sub(lostAt))
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLockLost) {
			t.Errorf("trial %d: Context cause = %v; want ErrLockLost", trial, cause)
		}
		for _, i := range []int{0, 2, 4} {
			rc.Resume(i)
		}
		l.Unlock(t.Context())
		if !eventually(time.Second, func() bool { return onLost.Load() == 1 }) || onLost.Load() != 1 {
			t.Errorf("trial %d: OnLost called %d times; want 1", trial, onLost.Load())
		}
	}
	close(stopProbe)
	if void > trials/3 || len(toLost) == 0 {
		t.Fatalf("%d of %d trials void: the test process stalled past ValidUntil too often to measure", void, trials)
	}
	slices.Sort(toLost)
	slices.Sort(beforeValid)
	t.Logf("pause majority -> Lost(), %d trials, TTL %v: median %v, p99 %v, max %v; reported before ValidUntil by min %v, median %v (negative: after); a 5ms sleep overran by up to %v meanwhile",
		len(toLost), ttl, toLost[len(toLost)/2], toLost[len(toLost)*99/100], toLost[len(toLost)-1], beforeValid[0], beforeValid[len(beforeValid)/2], <-probe)
	if late > 0 {
		t.Errorf("%d of %d loss reports came later than ValidUntil + %v", late, len(toLost), allowance)
	}
}

func TestReal_restartedNodeHealed(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	// Node timeout 280ms, the most under the 300ms renew interval: the
	// derived 90ms is little for a renewal's reconnect and script load on
	// a loaded machine (issue 31).
	l, err := c.Lock(t.Context(), "heal", WithTTL(900*time.Millisecond), WithNodeTimeout(280*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rc.Restart(1)
	if v := keyOn(t, rc, 1, "lock:heal"); v != "" {
		t.Fatalf("restarted node not empty: %q", v)
	}
	// The next renewal heals it: within one interval (300ms) plus a node
	// timeout (280ms) for the reconnect and the script load. Before the
	// renewal's requests to the slower nodes were let finish after the
	// majority decided (renew.Scheduler.launch), the heal was cut whenever
	// the restarted node was not among the first three to answer: 3 of 20
	// runs failed here, each with node 1's extend "context canceled".
	// Measured since: 70–273ms (10 runs) at load 14. 2s (7× that) still
	// fails a heal that waits for more than a few renewals, and a node never
	// healed.
	restarted := time.Now()
	if !eventually(2*time.Second, func() bool { return keyOn(t, rc, 1, "lock:heal") == l.Token() }) {
		t.Errorf("restarted node does not hold our token again after %v", time.Since(restarted).Round(time.Millisecond))
	}
	t.Logf("restarted node healed after %v (renewal interval 300ms)", time.Since(restarted).Round(time.Millisecond))
	if !l.Valid() {
		t.Errorf("lock not valid after a node restart")
	}
	l.Unlock(t.Context())
}

func TestReal_scriptFlushWhileHeld(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	// The TTL stays below the 2s sleep, so only renewals keep the lock
	// valid; node timeout 300ms, the most under the 333ms renew interval
	// (the derived 100ms is little on a loaded machine, issue 31).
	l, err := c.Lock(t.Context(), "flush", WithTTL(time.Second), WithNodeTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		rc.Admin(i).ScriptFlush(t.Context())
	}
	time.Sleep(2 * time.Second) // several renewals, each after NOSCRIPT
	if !l.Valid() {
		t.Errorf("lock lost after SCRIPT FLUSH; renewals must fall back to EVAL")
	}
	l.Unlock(t.Context())
}

func TestReal_killTwoHeldKillThirdLost(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	// Node timeout 600ms, the most under the 667ms renew interval: each
	// renewal on 3 of 5 nodes needs all three within it (the derived
	// 200ms is little on a loaded machine, issue 31; at 300ms of a 1s
	// TTL the lock was lost once with 3 nodes up, at load ~19). The TTL
	// bounds the loss below.
	const ttl = 2 * time.Second
	l, err := c.Lock(t.Context(), "k", WithTTL(ttl), WithNodeTimeout(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rc.Kill(0)
	rc.Kill(1)
	time.Sleep(ttl + ttl/2) // renewals on 3 nodes past the first TTL
	if !l.Valid() {
		t.Fatalf("lock lost with 3 of 5 nodes up")
	}
	rc.Kill(2)
	select {
	case <-l.Lost():
	case <-time.After(2 * ttl):
		t.Fatalf("lock not lost %v after a 3rd node was killed", 2*ttl)
	}
	if err := l.Extend(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend after loss = %v; want ErrLockLost", err)
	}
	l.Unlock(t.Context())
}

func TestReal_DoCancelledOnLoss(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	start := time.Now()
	// Timed from the pause: the Lock before fn, at the derived 50ms node
	// timeout, took seconds of retries once beside stress-ng (Do 4.0s in
	// all, .ci/stress run 3 on 7a9d7b4), which is not what this measures.
	var paused time.Time
	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		paused = time.Now()
		for _, i := range []int{1, 2, 3} {
			rc.Pause(i)
		}
		<-ctx.Done()
		return context.Cause(ctx)
	}, WithTTL(500*time.Millisecond))
	for _, i := range []int{1, 2, 3} {
		rc.Resume(i)
	}
	if !errors.Is(err, ErrLockLost) {
		t.Errorf("Do = %v; want ErrLockLost", err)
	}
	if paused.IsZero() {
		t.Fatalf("Do = %v without running fn", err)
	}
	if took := time.Since(paused); took > 3*time.Second {
		t.Errorf("Do returned %v after the pause (its Lock took %v); fn's ctx must be cancelled at the loss (TTL 500ms)", took, paused.Sub(start))
	}
}

// A holder whose renewals cannot get through (as if its process were paused)
// must report the loss, and its later Unlock must not delete the next
// holder's key. Client a reaches the nodes through the proxies, which are
// slowed to a crawl; client b goes to the servers directly.
func TestReal_stalledHolderSparesNextHolder(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := bystander(t, directClients(t, rc)) // the next holder
	l, err := a.Lock(t.Context(), "stall", WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		rc.SetLatency(i, 2*time.Second)
	}
	select {
	case <-l.Lost():
	case <-time.After(3 * time.Second):
		t.Fatalf("stalled holder not reported lost")
	}
	// Bounded: a's key expires within its 500ms TTL; a starved machine
	// fails the test here with a message instead of at go test's -timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	next, err := b.Lock(ctx, "stall", WithRetryDelay(10*time.Millisecond, 30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		rc.SetLatency(i, 0)
	}
	// nil is right too: a's delayed renewals may have set its key again on
	// a node outside b's majority (seen once at load 5–8 with stress-ng),
	// and Unlock reports nil when it released on any node. What matters is
	// that b's key survives, checked below.
	if err := l.Unlock(t.Context()); err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrNoQuorum) {
		t.Errorf("stale Unlock = %v; want nil, ErrNotHeld or ErrNoQuorum", err)
	}
	time.Sleep(2500 * time.Millisecond) // let a's delayed requests land
	if n := holders(t, rc, "lock:stall", next.Token()); n < 3 || !next.Valid() {
		t.Errorf("next holder's key on %d nodes, valid %v; want a majority, valid", n, next.Valid())
	}
	next.Unlock(t.Context())
}

func TestReal_closeLeavesNothing(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c, err := New(rc.Clients(), WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := c.Lock(t.Context(), fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// A release guard (":released:<token>") set for a request still in
	// flight at Close lives only about a node timeout plus the clock
	// error (guardLifetime); lock keys must be gone at once.
	left := func(guards bool) (out []string) {
		for i := range 5 {
			for _, k := range rc.Admin(i).Keys(t.Context(), "lock:*").Val() {
				if strings.Contains(k, scripts.GuardSuffix) != guards {
					continue
				}
				if v := keyOn(t, rc, i, k); v != "" {
					out = append(out, fmt.Sprintf("node %d keeps %s = %q", i, k, v))
				}
			}
		}
		return out
	}
	for _, l := range left(false) {
		t.Errorf("%s after Close", l)
	}
	if !eventually(10*time.Second, func() bool { return len(left(true)) == 0 }) {
		t.Errorf("release guards 10s after Close: %v", left(true))
	}
	// goleak in TestMain checks that no goroutine is left.
}

// node-redlock can hand out a lock whose validity is already spent. An
// attempt that reached a majority too late must fail, and leave no key.
func TestReal_noValidityLeftIsNotObtained(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	// Warm the connections, so the latency below is all the round trip costs.
	warmUp(t, c)
	for i := range 5 {
		rc.SetLatency(i, 550*time.Millisecond) // a 1.1s round trip
	}
	// TTL 2s with drift 0.5: 1,002ms of allowance, so a 1.1s round trip
	// leaves no validity although every node grants (within the 1.9s node
	// timeout). The margins are wide for a loaded machine: with TTL 100ms,
	// a 60ms round trip and a 90ms node timeout, requests delayed 30ms more
	// by the scheduler failed instead of granting (ErrNoQuorum).
	// A fixed lease: with renewal, these options are refused (interval +
	// node timeout must be below the validity, and then every round a
	// majority grants within the node timeout leaves some).
	opts := []Option{WithTTL(2 * time.Second), WithDriftFactor(0.5), WithAutoRenew(false),
		WithRenewInterval(1990 * time.Millisecond), WithNodeTimeout(1980 * time.Millisecond)}
	for _, fencing := range []bool{false, true} {
		// The last attempt's grants are released by the Client, a round
		// trip (1.1s here) after TryLock returned (step 4).
		if !noLockKey(t, rc, "lock:late", 5*time.Second) {
			t.Fatalf("fencing %v: the last attempt's keys are still there", fencing)
		}
		// Their replies are still on the way back (550ms): a round sent
		// meanwhile took two round trips here (noticed, not explained; see
		// the issue 21 note), which this test is not about.
		time.Sleep(1500 * time.Millisecond)
		l, err := c.TryLock(t.Context(), "late", append(opts, WithFencing(fencing))...)
		if err == nil {
			t.Errorf("fencing %v: TryLock = a lock valid until %v (in %v); want no lock", fencing, l.ValidUntil(), time.Until(l.ValidUntil()))
			continue
		}
		// What matters is that no lock came back. ErrNoQuorum is also
		// right when a loaded machine (-race beside stress-ng) let the
		// 1.1s round trips miss the 1.98s node timeout on a majority.
		if !errors.Is(err, ErrNotObtained) && !errors.Is(err, ErrNoQuorum) {
			t.Errorf("fencing %v: TryLock = %v; want ErrNotObtained", fencing, err)
		}
	}
	// The release takes a 1.1s round trip from the Client's goroutines
	// (step 4): 5s, as above, is room for a loaded machine (2s failed once
	// at load 11.6).
	if !noLockKey(t, rc, "lock:late", 5*time.Second) {
		t.Errorf("a late grant left its key behind")
	}
}

// DESIGN step 4: no request may land after its release. A renewal that
// timed out on a paused node is still executed when the node resumes,
// possibly after the Unlock's release there; the release's guard keeps it
// from setting our key again.
func TestReal_lateRequestAfterReleaseLeavesNoKey(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	// Node timeout 600ms, the most under the 667ms renew interval (the
	// default, 200ms, missed a majority's release answers once in the full
	// suite beside stress-ng, load 6-8).
	c := newClient(t, rc.Clients(), WithNodeTimeout(600*time.Millisecond))
	for trial := range 3 {
		l, err := c.Lock(t.Context(), "late-extend", WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		rc.Pause(0)
		// Two renewals (every 667ms) go to node 0 and time out there.
		time.Sleep(1500 * time.Millisecond)
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("trial %d: Unlock with 4 of 5 nodes = %v", trial, err)
		}
		rc.Resume(0)
		time.Sleep(300 * time.Millisecond) // node 0 runs what was queued
		if v := keyOn(t, rc, 0, "lock:late-extend"); v == l.Token() {
			pttl := rc.Admin(0).PTTL(t.Context(), "lock:late-extend").Val()
			t.Errorf("trial %d: node 0 holds our key again after the release (TTL left %v)", trial, pttl)
		}
	}
}

// dumpKeys logs every key on rc's nodes with its type, PTTL and value (a
// sorted set's members with their scores): what a liveness failure left.
func dumpKeys(t *testing.T, rc *redistest.Cluster) {
	t.Helper()
	ctx := context.Background()
	for i := range rc.N() {
		a := rc.Admin(i)
		keys, err := a.Keys(ctx, "*").Result()
		if err != nil {
			t.Logf("node %d: KEYS: %v", i, err)
			continue
		}
		slices.Sort(keys)
		for _, k := range keys {
			typ, _ := a.Type(ctx, k).Result()
			pttl, _ := a.PTTL(ctx, k).Result()
			var v any
			switch typ {
			case "string":
				v, _ = a.Get(ctx, k).Result()
			case "zset":
				v, _ = a.ZRangeWithScores(ctx, k, 0, -1).Result()
			case "hash":
				v, _ = a.HGetAll(ctx, k).Result()
			}
			t.Logf("node %d: %s (%s, PTTL %v): %v", i, k, typ, pttl, v)
		}
	}
}
