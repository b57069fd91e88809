package redlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// extendCount counts renewal rounds.
type extendCount struct {
	NoHooks
	n atomic.Int64
}

func (h *extendCount) Extend(context.Context, ExtendInfo) { h.n.Add(1) }

func TestWithMaxHold_lostWithCause(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	ext := &extendCount{}
	// TTL 3s, renewed every second, node timeout 500ms: a loaded machine
	// keeps it renewed until the cap.
	ttl := 3 * time.Second
	c := newClient(t, nodes, WithTTL(ttl), WithNodeTimeout(500*time.Millisecond), WithRenewInterval(time.Second), WithHooks(ext))
	onLost := make(chan error, 1)
	const holdCap = 1500 * time.Millisecond
	start := time.Now()
	l, err := c.Lock(t.Context(), "capped", WithMaxHold(holdCap), WithOnLost(func(_ *Lock, err error) { onLost <- err }))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("not lost within 10s of a 1.5s cap")
	}
	if d := time.Since(start); d < holdCap {
		t.Errorf("lost after %v; want ≥ the cap %v", d, holdCap)
	}
	if ext.n.Load() == 0 {
		t.Errorf("no renewal before the cap; want the lock renewed until then (renewed every 1s, cap 1.5s)")
	}
	cause := context.Cause(l.Context())
	if !errors.Is(cause, ErrMaxHold) || !errors.Is(cause, ErrLockLost) {
		t.Errorf("Cause(Context()) = %v; want ErrMaxHold and ErrLockLost", cause)
	}
	select {
	case err := <-onLost:
		if !errors.Is(err, ErrMaxHold) {
			t.Errorf("OnLost(%v); want ErrMaxHold", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnLost not called")
	}
	if err := l.Extend(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend after the cap = %v; want ErrLockLost", err)
	}
	// Renewal stopped: no round after the loss, and the key runs out by
	// itself within the TTL.
	n := ext.n.Load()
	if ok, err := c.IsLocked(t.Context(), "capped"); err != nil || !ok {
		t.Errorf("IsLocked right after the cap = %v, %v; want true: the key stays until its TTL", ok, err)
	}
	if !eventually(5*ttl, func() bool { ok, _ := c.IsLocked(t.Context(), "capped"); return !ok }) {
		t.Errorf("key still held 5×TTL after the cap; want it gone within its TTL")
	}
	if got := ext.n.Load(); got != n {
		t.Errorf("%d renewals after the cap; want 0", got-n)
	}
	_ = l.Unlock(t.Context())
}

func TestWithMaxHold_unlockedBeforeCap(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithMaxHold(200*time.Millisecond), WithNodeTimeout(2*time.Second))
	l, err := c.Lock(t.Context(), "early")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	select {
	case <-l.Lost():
		t.Errorf("Lost() closed after Unlock; want the cap's timer stopped")
	default:
	}
	if got := context.Cause(l.Context()); !errors.Is(got, ErrUnlocked) {
		t.Errorf("Cause = %v; want ErrUnlocked", got)
	}
}

func TestWithMaxHold_defaultNone(t *testing.T) {
	t.Parallel()
	if got := defaultConfig().maxHold; got != 0 {
		t.Errorf("default max hold = %v; want 0 (none)", got)
	}
	if _, err := buildConfig(defaultConfig(), []Option{WithMaxHold(-1)}, false); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("WithMaxHold(-1): buildConfig = %v; want ErrInvalidArgument", err)
	}
}
