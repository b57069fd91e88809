package redlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// counter counts the commands sent to nodes, to prove "no I/O".
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// miniNodes starts n miniredis nodes (TTLs run in real time) and clients.
func miniNodes(t testing.TB, n int) ([]*miniredis.Miniredis, []redis.UniversalClient) {
	t.Helper()
	var ms []*miniredis.Miniredis
	var cs []redis.UniversalClient
	for range n {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		ms = append(ms, m)
		cs = append(cs, c)
	}
	return ms, cs
}

func countingNodes(t *testing.T, n int) ([]redis.UniversalClient, *counter) {
	t.Helper()
	_, cs := miniNodes(t, n)
	h := &counter{}
	for _, c := range cs {
		c.(*redis.Client).AddHook(h)
	}
	return cs, h
}

func newClient(t *testing.T, nodes []redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	c, err := New(nodes, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A bystander Client's timing. Its node timeout is 5× the slowest first
// round trips (slots, dial, HELLO, script load) measured in redlock's tests
// beside stress-ng --cpu 2 at load 17–20, about 600ms, rounded up; its TTL
// outlasts any test in this package, and it renews (every TTL/3) besides.
const (
	bystanderNodeTimeout = 5 * time.Second
	bystanderTTL         = 2 * time.Minute
)

// bystander returns a Client for a test's set-up and checks (the Client
// that resumes, the "next" or "other" Client that takes the lock to show it
// is free, the one that cleans up): not the subject whose timing the test
// is about. Every such Client goes through here (docs/development.md): one
// stall of a loaded machine must not fail a test at a Client that only
// watches. Its node timeout is bystanderNodeTimeout, its TTL bystanderTTL,
// renewed automatically: these are applied after opts, so reusing the
// subject's option list (WithNodeTimeout(500ms), a short TTL, WithAutoRenew
// false) cannot hand it the subject's timing; opts carry the rest (hooks, a
// key prefix, fencing). Per-call options on its Lock and TryLock still win,
// so pass none that shorten its timing.
func bystander(t *testing.T, nodes []redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	return newClient(t, nodes, append(slices.Clone(opts),
		WithTTL(bystanderTTL), WithRenewInterval(bystanderTTL/3),
		WithNodeTimeout(bystanderNodeTimeout), WithAutoRenew(true))...)
}

func TestClient_Lock_exclusive(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 5)
	// 50 goroutines share each node's pool of 20 connections, and a
	// miniredis node runs one script at a time: under -race on a loaded
	// machine, requests queued for a connection missed the default 1s node
	// timeout, and then 5s (TryLock and Unlock failed with ErrNoQuorum).
	// The slowest reply measured in the full suite beside stress-ng --cpu 2
	// at load 17–20 was 4.3s: 25s is 5× that and more, and TTL 2m lets it
	// (the renew interval, 40s, stays above it). Exclusion does not depend
	// on the timeout.
	c := newClient(t, nodes, WithTTL(2*time.Minute), WithNodeTimeout(25*time.Second))
	// Single attempts: split votes may leave no winner, never two.
	var winners atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			_, err := c.TryLock(t.Context(), "race")
			switch {
			case err == nil:
				winners.Add(1) // kept: nobody else may win meanwhile
			case !errors.Is(err, ErrNotObtained):
				t.Errorf("TryLock = %v; want nil or ErrNotObtained", err)
			}
		})
	}
	wg.Wait()
	if got := winners.Load(); got > 1 {
		t.Errorf("%d winners; want at most 1", got)
	}
	// With retries, every goroutine gets its turn, one at a time.
	var holders, maxHolders, done atomic.Int32
	for range 20 {
		wg.Go(func() {
			l, err := c.Lock(t.Context(), "turns", WithRetryDelay(5*time.Millisecond, 50*time.Millisecond))
			if err != nil {
				t.Errorf("Lock = %v", err)
				return
			}
			h := holders.Add(1)
			if h > maxHolders.Load() {
				maxHolders.Store(h)
			}
			time.Sleep(time.Millisecond)
			holders.Add(-1)
			if err := l.Unlock(t.Context()); err != nil {
				t.Errorf("Unlock = %v", err)
			}
			done.Add(1)
		})
	}
	wg.Wait()
	if maxHolders.Load() != 1 || done.Load() != 20 {
		t.Errorf("max concurrent holders %d, completed %d; want 1, 20", maxHolders.Load(), done.Load())
	}
}

func TestClient_Lock_keysAndRelease(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	// A node timeout of 3s, the most under the 3.33s renew interval: at
	// load ~19 under -race a miniredis node's reply to IsLocked missed
	// the derived 1s.
	c := newClient(t, nodes, WithTTL(10*time.Second), WithNodeTimeout(3*time.Second))
	l, err := c.Lock(t.Context(), "invoice:1")
	if err != nil {
		t.Fatal(err)
	}
	// Lock returned once a majority granted; the last node follows, or
	// its request ran past its bound (the node timeout; load) and set
	// nothing, which the node-timeout wait below lets pass: a majority
	// holding the token is what Lock promises.
	holding := 0
	for _, m := range ms {
		if eventually(3*time.Second, func() bool { got, _ := m.Get("lock:invoice:1"); return got == l.Token() }) {
			holding++
		}
	}
	if holding < 2 {
		t.Errorf("%d of 3 nodes hold our token; want a majority at least", holding)
	}
	if locked, err := c.IsLocked(t.Context(), "invoice:1"); !locked || err != nil {
		t.Errorf("IsLocked = %v, %v; want true", locked, err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock = %v", err)
	}
	// Unlock returned once a majority released; the last node follows
	// (its release is retried in the background: 10s is the bound of a
	// hang, not a wait).
	for i, m := range ms {
		if !eventually(10*time.Second, func() bool { v, _ := m.Get("lock:invoice:1"); return v == "" }) {
			t.Errorf("node %d still has the key after Unlock", i)
		}
	}
	if locked, err := c.IsLocked(t.Context(), "invoice:1"); locked || err != nil {
		t.Errorf("IsLocked after Unlock = %v, %v; want false", locked, err)
	}
	if err := l.Unlock(t.Context()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Unlock = %v; want ErrNotHeld", err)
	}
	if err := l.Extend(t.Context()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend after Unlock = %v; want ErrNotHeld", err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrUnlocked) {
		t.Errorf("Context cause after Unlock = %v; want ErrUnlocked", cause)
	}
	select {
	case <-l.Lost():
		t.Errorf("Lost() closed by Unlock")
	default:
	}
}

func TestLock_nil(t *testing.T) {
	t.Parallel()
	var l *Lock
	if err := l.Unlock(t.Context()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("nil Unlock = %v; want ErrNotHeld", err)
	}
	if err := l.Extend(t.Context()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("nil Extend = %v; want ErrNotHeld", err)
	}
	if l.Valid() {
		t.Errorf("nil Valid = true")
	}
	select {
	case <-l.Lost():
	default:
		t.Errorf("nil Lost() not closed")
	}
	if l.Context().Err() == nil {
		t.Errorf("nil Context not cancelled")
	}
	if l.Fence() != 0 || l.Token() != "" || l.Resource() != "" || !l.ValidUntil().IsZero() {
		t.Errorf("nil accessors not zero")
	}
}

func TestLock_fixedLeaseExpires(t *testing.T) {
	t.Parallel()
	nodes, _ := countingNodes(t, 3)
	c := newClient(t, nodes)
	l, err := c.Lock(t.Context(), "fixed", WithTTL(300*time.Millisecond), WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if !l.Valid() {
		t.Fatalf("Valid() = false right after Lock")
	}
	until := l.ValidUntil()
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatalf("fixed lease not reported lost 5s after its ValidUntil")
	}
	if now := time.Now(); now.Before(until) {
		t.Errorf("lost %v before ValidUntil", until.Sub(now))
	}
	if l.Valid() {
		t.Errorf("Valid() = true after ValidUntil")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLockLost) {
		t.Errorf("Context cause = %v; want ErrLockLost", cause)
	}
	if err := l.Extend(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend after expiry = %v; want ErrLockLost", err)
	}
}

func TestLock_ExtendAfterValidUntilDoesNoIO(t *testing.T) {
	t.Parallel()
	nodes, cnt := countingNodes(t, 3)
	c := newClient(t, nodes)
	l, err := c.Lock(t.Context(), "r", WithTTL(200*time.Millisecond), WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(l.ValidUntil()))
	before := cnt.n.Load()
	if err := l.Extend(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend at ValidUntil = %v; want ErrLockLost", err)
	}
	if got := cnt.n.Load() - before; got != 0 {
		t.Errorf("Extend after ValidUntil sent %d commands; want none", got)
	}
}

func TestLock_ExtendMovesValidUntil(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	// TTL 10s for a 1s node timeout: with 2s (200ms) the final Unlock
	// failed with ErrNoQuorum on a loaded machine.
	l, err := c.Lock(t.Context(), "r", WithTTL(10*time.Second), WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	before := l.ValidUntil()
	time.Sleep(20 * time.Millisecond)
	if err := l.Extend(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !l.ValidUntil().After(before) {
		t.Errorf("ValidUntil did not move: %v -> %v", before, l.ValidUntil())
	}
	// A majority taken over by another token: Extend reports the loss.
	for _, m := range ms[:2] {
		m.Set("lock:r", "someone-else")
	}
	err = l.Extend(t.Context())
	if !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with a majority lost = %v; want ErrLockLost and ErrNotHeld", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Errorf("Lost() not closed after a majority said not ours")
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock of the one node still ours = %v; want nil", err)
	}
	for i, m := range ms[:2] {
		if got, _ := m.Get("lock:r"); got != "someone-else" {
			t.Errorf("node %d: Unlock touched another owner's key: %q", i, got)
		}
	}
}

func TestClient_wrongTypeIsNodeError(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	for _, m := range ms[:2] {
		if _, err := m.Lpush("lock:list", "x"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.TryLock(t.Context(), "list")
	var ne *NodeError
	if !errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotObtained) || !errors.As(err, &ne) {
		t.Errorf("TryLock over a list key = %v; want ErrNoQuorum with *NodeError, not ErrNotObtained", err)
	}
}

func TestClient_Close(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	// A node timeout of 5s: Close leaves a node that does not answer
	// within it (and a 250ms grace) to the keys' TTLs, and returns nil
	// once a majority released each lock, as Unlock does. At the default
	// 1s, in-process node 0 missed it in the full suite beside stress-ng
	// (load 8-11) and kept two keys.
	c, err := New(nodes, WithNodeTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var locks []*Lock
	for _, r := range []string{"a", "b", "c"} {
		l, err := c.Lock(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v; want nil", err)
	}
	for i, m := range ms {
		for _, k := range m.Keys() {
			if v, _ := m.Get(k); v != "" && !strings.Contains(k, scripts.GuardSuffix) {
				t.Errorf("node %d keeps %s = %q after Close", i, k, v)
			}
		}
	}
	for _, l := range locks {
		if cause := context.Cause(l.Context()); !errors.Is(cause, ErrClosed) || l.Valid() {
			t.Errorf("lock %s: cause %v valid %v; want ErrClosed, false", l.Resource(), cause, l.Valid())
		}
	}
	ctx := t.Context()
	if _, err := c.Lock(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("Lock after Close = %v; want ErrClosed", err)
	}
	if _, err := c.TryLock(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("TryLock after Close = %v; want ErrClosed", err)
	}
	if _, err := c.IsLocked(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("IsLocked after Close = %v; want ErrClosed", err)
	}
	if err := locks[0].Unlock(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Unlock after Close = %v; want ErrClosed", err)
	}
	if err := locks[0].Extend(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Extend after Close = %v; want ErrClosed", err)
	}
	if err := c.Do(ctx, "x", func(context.Context) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Do after Close = %v; want ErrClosed", err)
	}
}

func TestClient_CloseWakesWaiters(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c, err := New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(t.Context(), "busy"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Lock(context.Background(), "busy")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("waiting Lock after Close = %v; want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("a waiting Lock did not return after Close")
	}
}

func TestClient_Do(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	want := errors.New("job failed")
	var sawValid bool
	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		locked, _ := c.IsLocked(ctx, "job")
		sawValid = locked
		return want
	})
	if !errors.Is(err, want) || errors.Is(err, ErrLockLost) || !sawValid {
		t.Errorf("Do = %v (locked inside: %v); want fn's error only, locked inside", err, sawValid)
	}
	for i, m := range ms {
		if !eventually(time.Second, func() bool { v, _ := m.Get("lock:job"); return v == "" }) {
			t.Errorf("node %d keeps the key after Do", i)
		}
	}
}

func TestClient_Do_lost(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithTTL(600*time.Millisecond))
	var cause error
	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		for _, m := range ms {
			m.Set("lock:job", "thief") // every node now holds another token
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("fn's ctx never cancelled")
		}
	})
	if !errors.Is(err, ErrLockLost) || !errors.Is(err, context.Canceled) || !errors.Is(cause, ErrLockLost) {
		t.Errorf("Do = %v (fn's cause %v); want ErrLockLost joined with fn's error, cause ErrLockLost", err, cause)
	}
	for i, m := range ms {
		if got, _ := m.Get("lock:job"); got != "thief" {
			t.Errorf("node %d: Do's release touched another owner's key: %q", i, got)
		}
	}
}

func TestLock_OnLostMayUnlockAndClose(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c, err := New(nodes, WithTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	called := make(chan error, 2)
	l, err := c.Lock(t.Context(), "cb", WithOnLost(func(l *Lock, err error) {
		_ = l.Unlock(context.Background()) // must not deadlock
		_ = c.Close()
		called <- err
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		m.Set("lock:cb", "thief")
	}
	select {
	case err := <-called:
		if !errors.Is(err, ErrLockLost) {
			t.Errorf("OnLost err = %v; want ErrLockLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("OnLost not called")
	}
	time.Sleep(50 * time.Millisecond)
	if len(called) != 0 {
		t.Errorf("OnLost called more than once")
	}
	_ = l
}
