package scripts

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// The guard reads INFO, which miniredis lacks: these tests need a real
// redis-server.

func TestAcquireGuarded_youngNodeGrantsNothing(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 1)
	c, admin := rc.Client(0), rc.Admin(0)
	ctx := t.Context()
	k := NewKeys("lock:g", "lock:g:fence", "tok")

	ok, fence, err := AcquireGuarded(ctx, c, k, "tok", time.Second, Waiter{}, wake, 30*time.Second)
	var young *Young
	if !errors.As(err, &young) || ok {
		t.Fatalf("AcquireGuarded on a node just started = %v, %v; want a *Young error", ok, err)
	}
	if young.Uptime >= 30*time.Second || young.Guard != 30*time.Second || fence != 0 {
		t.Errorf("Young = %+v, fence %d; want an uptime under 30s, guard 30s, fence 0", young, fence)
	}
	if n, _ := admin.Exists(ctx, k.Lock, k.Fence).Result(); n != 0 {
		t.Errorf("keys after a guarded refusal: %d exist; want none (nothing written)", n)
	}

	// Another token's key is refused for youth too, and left alone.
	admin.Set(ctx, k.Lock, "other", time.Minute)
	if _, _, err := AcquireGuarded(ctx, c, k, "tok", time.Second, Waiter{}, wake, 30*time.Second); !errors.As(err, &young) {
		t.Errorf("AcquireGuarded over another key on a young node = %v; want *Young", err)
	}
	if v, _ := admin.Get(ctx, k.Lock).Result(); v != "other" {
		t.Errorf("key after guarded refusal = %q; want %q", v, "other")
	}
}

func TestAcquireGuarded_grantsOnceUpLongEnough(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 1)
	c, admin := rc.Client(0), rc.Admin(0)
	ctx := t.Context()
	k := NewKeys("lock:g", "lock:g:fence", "tok")
	admin.Set(ctx, k.Fence, 7, 0)

	// A guard of 1ns is rounded up to 1s; the node grants once it reports
	// an uptime of 2s (a reported 1s may be a few milliseconds).
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, fence, err := AcquireGuarded(ctx, c, k, "tok", time.Second, Waiter{}, wake, time.Nanosecond)
		var young *Young
		if errors.As(err, &young) {
			if time.Now().After(deadline) {
				t.Fatalf("still young after 5s: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if !ok || err != nil || fence != 7 {
			t.Fatalf("AcquireGuarded on a node up 2s, guard 1s = %v, %d, %v; want true, 7, nil", ok, fence, err)
		}
		break
	}
	if v, _ := admin.Get(ctx, k.Lock).Result(); v != "tok" {
		t.Errorf("key after grant = %q; want %q", v, "tok")
	}
	// Without a fence key the reply is the plain integer of acquire.lua.
	if ok, _, err := AcquireGuarded(ctx, c, NewKeys("lock:h", "", "tok"), "tok", time.Second, Waiter{}, wake, time.Nanosecond); !ok || err != nil {
		t.Errorf("AcquireGuarded without fencing = %v, %v; want true, nil", ok, err)
	}
}

func TestAcquireGuarded_withoutINFOIsANodeError(t *testing.T) {
	t.Parallel()
	_, c := newNode(t) // miniredis: no INFO
	_, _, err := AcquireGuarded(t.Context(), c, NewKeys("lock:g", "", "tok"), "tok", time.Second, Waiter{}, wake, time.Second)
	var young *Young
	var re redis.Error
	if err == nil || errors.As(err, &young) || !errors.As(err, &re) {
		t.Errorf("AcquireGuarded on miniredis = %v; want a Redis error reply, not *Young", err)
	}
}
