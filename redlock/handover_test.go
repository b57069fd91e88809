package redlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestResume_handover(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	// Node timeout 3s: over 5× the slowest round on these in-process
	// nodes measured under -race (536ms; 10 runs with -count=10 at load
	// 29–31 on 2 cores, beside stress-ng --cpu 2 and other test runs; the
	// log line below prints it). 300ms failed at load 6–8. The interval
	// and the TTL follow from it (node timeout < interval, interval + node
	// timeout < TTL − drift).
	ttl := 7 * time.Second
	rounds := &slowestRound{}
	opts := []Option{WithTTL(ttl), WithNodeTimeout(3 * time.Second), WithRenewInterval(3500 * time.Millisecond), WithHooks(rounds)}
	t.Cleanup(func() { t.Logf("slowest round: %v", rounds.max()) })
	scheduler := newClient(t, nodes, opts...)
	worker := newClient(t, nodes, opts...)
	l, err := scheduler.Lock(t.Context(), "job:7")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Detach(); err != nil {
		t.Fatalf("Detach = %v", err)
	}
	if got := context.Cause(l.Context()); !errors.Is(got, ErrDetached) {
		t.Errorf("Cause after Detach = %v; want ErrDetached", got)
	}
	if l.Valid() {
		t.Errorf("Valid() after Detach = true; want false")
	}
	if err := l.Detach(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Detach = %v; want ErrNotHeld", err)
	}
	w, err := worker.Resume(t.Context(), l.Resource(), l.Token())
	if err != nil {
		t.Fatalf("Resume = %v", err)
	}
	if got, want := w.Token(), l.Token(); got != want || !w.Valid() {
		t.Errorf("resumed Token() = %q, Valid %v; want the handed-over token, valid", got, w.Valid())
	}
	// The scheduler lets go entirely: its Unlock and Close release nothing.
	if err := l.Unlock(t.Context()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Unlock after Detach = %v; want ErrNotHeld", err)
	}
	if err := scheduler.Close(); err != nil {
		t.Fatal(err)
	}
	// The worker renews it past its TTL: unrenewed, the keys Resume set
	// would be gone from every node a TTL after it, and the lease invalid;
	// a second past that is enough to tell (1.5×TTL, 3.5s more, was waited
	// before).
	time.Sleep(ttl + time.Second)
	if ok, err := worker.IsLocked(t.Context(), "job:7"); !ok || err != nil || !w.Valid() {
		t.Errorf("a TTL and 1s after Resume: IsLocked = %v, %v, Valid %v; want held, renewed by the worker", ok, err, w.Valid())
	}
	if err := w.Unlock(t.Context()); err != nil {
		t.Fatalf("worker Unlock = %v", err)
	}
	if ok, _ := worker.IsLocked(t.Context(), "job:7"); ok {
		t.Errorf("IsLocked after the worker's Unlock = true; want false")
	}
}

// Detach refuses the kinds of lock Resume cannot take over (a reader, a
// writer, a multi-lock), before it changes anything: the lock stays held
// and valid, and its own Unlock releases it. Before, Detach handed them
// over, no Resume could take them (it builds a plain lock's keys), and
// their keys stayed for a TTL with nobody holding them.
func TestDetach_refusesWhatResumeCannotTake(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithNodeTimeout(3*time.Second))
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		lock func() (*Lock, error)
	}{
		{"reader", func() (*Lock, error) { return c.TryRLock(ctx, "detach-r") }},
		{"writer", func() (*Lock, error) { return c.TryWLock(ctx, "detach-w") }},
		{"multi-lock", func() (*Lock, error) { return c.TryLockAll(ctx, []string{"detach-a", "detach-b"}) }},
	} {
		l, err := tc.lock()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := l.Detach(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: Detach = %v; want ErrInvalidArgument", tc.name, err)
		}
		if !l.Valid() || context.Cause(l.Context()) != nil {
			t.Errorf("%s: after the refused Detach: Valid %v, Cause %v; want held", tc.name, l.Valid(), context.Cause(l.Context()))
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("%s: Unlock after the refused Detach = %v; want nil", tc.name, err)
		}
	}
}

func TestResume_refused(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithTTL(10*time.Second), WithNodeTimeout(2*time.Second))
	keysOf := func(key string) int {
		n := 0
		for _, m := range ms {
			if m.Exists(key) {
				n++
			}
		}
		return n
	}
	t.Run("unknown token", func(t *testing.T) {
		_, err := c.Resume(t.Context(), "r1", uuid.NewString())
		if !errors.Is(err, ErrNotHeld) {
			t.Errorf("Resume(unknown token) = %v; want ErrNotHeld", err)
		}
		if !eventually(5*time.Second, func() bool { return keysOf("lock:r1") == 0 }) {
			t.Errorf("lock key left on %d nodes 5s later; want 0 (what the round healed is taken back)", keysOf("lock:r1"))
		}
	})
	t.Run("expired", func(t *testing.T) {
		other := newClient(t, nodes, WithNodeTimeout(300*time.Millisecond))
		l, err := other.Lock(t.Context(), "r2", WithTTL(time.Second), WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		l.Detach()
		time.Sleep(1200 * time.Millisecond)
		if _, err := c.Resume(t.Context(), "r2", l.Token()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("Resume(expired) = %v; want ErrNotHeld", err)
		}
	})
	t.Run("held on a minority", func(t *testing.T) {
		tok := uuid.NewString()
		ms[0].Set("lock:r3", tok)
		ms[0].SetTTL("lock:r3", 10*time.Second)
		if _, err := c.Resume(t.Context(), "r3", tok); !errors.Is(err, ErrNotHeld) {
			t.Errorf("Resume(minority) = %v; want ErrNotHeld", err)
		}
		if !eventually(5*time.Second, func() bool { return keysOf("lock:r3") == 0 }) {
			t.Errorf("key on %d nodes 5s later; want 0: no majority held it, so it is released everywhere", keysOf("lock:r3"))
		}
	})
	t.Run("invalid", func(t *testing.T) {
		for _, tok := range []string{"", "abc", "{" + uuid.NewString() + "}"} {
			if _, err := c.Resume(t.Context(), "r4", tok); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Resume(token %q) = %v; want ErrInvalidArgument", tok, err)
			}
		}
		if _, err := c.Resume(t.Context(), "", uuid.NewString()); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Resume(empty resource) = %v; want ErrInvalidArgument", err)
		}
		l, err := c.Lock(t.Context(), "r5")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Resume(t.Context(), "r5", l.Token()); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Resume of a lock this Client holds = %v; want ErrInvalidArgument", err)
		}
		l.Unlock(t.Context())
	})
}

func TestResume_noQuorum(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	a := newClient(t, nodes, WithNodeTimeout(2*time.Second))
	l, err := a.Lock(t.Context(), "nq")
	if err != nil {
		t.Fatal(err)
	}
	l.Detach()
	b := newClient(t, nodes, WithNodeTimeout(2*time.Second))
	ms[1].SetError("LOADING")
	ms[2].SetError("LOADING")
	_, err = b.Resume(t.Context(), "nq", l.Token())
	var ne *NodeError
	if !errors.Is(err, ErrNoQuorum) || !errors.As(err, &ne) {
		t.Fatalf("Resume with 2 of 3 nodes failing = %v; want ErrNoQuorum with node errors", err)
	}
	// The keys that held the token are left: a retry once the nodes are
	// back resumes it.
	ms[1].SetError("")
	ms[2].SetError("")
	r, err := b.Resume(t.Context(), "nq", l.Token())
	if err != nil {
		t.Fatalf("Resume retried = %v", err)
	}
	r.Unlock(t.Context())
}

func TestClient_Held(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithNodeTimeout(2*time.Second))
	if got := c.Held(); len(got) != 0 {
		t.Errorf("Held() = %d locks; want none", len(got))
	}
	b, _ := c.Lock(t.Context(), "b")
	a, _ := c.Lock(t.Context(), "a")
	d, _ := c.Lock(t.Context(), "d")
	s := newSemaphore(t, c, "s", 2)
	p, err := s.TryAcquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	resources := func() []string {
		var out []string
		for _, l := range c.Held() {
			out = append(out, l.Resource())
		}
		return out
	}
	if got, want := resources(), []string{"a", "b", "d", p.Resource()}; !slices.Equal(got, want) {
		t.Errorf("Held() = %q; want %q", got, want)
	}
	b.Unlock(t.Context())
	d.Detach()
	if got, want := resources(), []string{"a", p.Resource()}; !slices.Equal(got, want) {
		t.Errorf("Held() after Unlock(b), Detach(d) = %q; want %q", got, want)
	}
	c.Close()
	if got := c.Held(); got != nil {
		t.Errorf("Held() after Close = %v; want nil", got)
	}
	_ = a
}

// slowestRound records the longest acquisition or extension round.
type slowestRound struct {
	NoHooks
	mu sync.Mutex
	d  time.Duration // protected by mu
}

func (s *slowestRound) note(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d = max(s.d, d)
}

func (s *slowestRound) max() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.d
}

func (s *slowestRound) Attempt(_ context.Context, i AttemptInfo) { s.note(i.Latency) }
func (s *slowestRound) Extend(_ context.Context, i ExtendInfo)   { s.note(i.Latency) }
