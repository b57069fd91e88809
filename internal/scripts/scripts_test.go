package scripts

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func newNode(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return m, c
}

// paths runs each test twice: once with the scripts cached on the node
// (EVALSHA), once after SCRIPT FLUSH (NOSCRIPT, then the EVAL fallback).
var paths = []struct {
	name  string
	setup func(ctx context.Context, c *redis.Client) error
}{
	{"evalsha", func(ctx context.Context, c *redis.Client) error {
		for _, s := range []*redis.Script{acquire, commit, extend, release, exists} {
			if err := s.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}},
	{"noscript fallback", func(ctx context.Context, c *redis.Client) error {
		return c.ScriptFlush(ctx).Err()
	}},
}

func TestScripts(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ctx := t.Context()
			m, c := newNode(t)
			if err := p.setup(ctx, c); err != nil {
				t.Fatal(err)
			}
			const key, tok, other = "lock:r", "tok-a", "tok-b"
			k, ko := NewKeys(key, "", tok), NewKeys(key, "", other)

			if ok, err := acquire1(ctx, c, k, tok, time.Second); !ok || err != nil {
				t.Fatalf("Acquire on empty = %v, %v; want true, nil", ok, err)
			}
			if ok, err := acquire1(ctx, c, k, tok, 5*time.Second); !ok || err != nil {
				t.Fatalf("Acquire again with our token = %v, %v; want true, nil (idempotent)", ok, err)
			}
			if got := m.TTL(key); got != 5*time.Second {
				t.Errorf("TTL after refresh = %v; want 5s", got)
			}
			if ok, err := acquire1(ctx, c, ko, other, time.Second); ok || err != nil {
				t.Fatalf("Acquire by another token = %v, %v; want false, nil", ok, err)
			}
			if got, err := Extend(ctx, c, ko, other, time.Second, 0); got != NotOurs || err != nil {
				t.Errorf("Extend by another token = %v, %v; want NotOurs", got, err)
			}
			if got, err := Extend(ctx, c, k, tok, 7*time.Second, 0); got != Rearmed || err != nil {
				t.Errorf("Extend = %v, %v; want Rearmed", got, err)
			}
			if got := m.TTL(key); got != 7*time.Second {
				t.Errorf("TTL after Extend = %v; want 7s", got)
			}
			if ok, err := Exists(ctx, c, key); !ok || err != nil {
				t.Errorf("Exists = %v, %v; want true", ok, err)
			}
			if ok, err := Release(ctx, c, ko, other, 0, "", false); ok || err != nil {
				t.Errorf("Release by another token = %v, %v; want false", ok, err)
			}
			if got, _ := m.Get(key); got != tok {
				t.Errorf("key after foreign Release = %q; want %q", got, tok)
			}
			if m.Exists(ko.Guard) {
				t.Errorf("a release without a guard left the guard key %q", ko.Guard)
			}
			// Released with no request in flight: deleted, nothing left.
			if ok, err := Release(ctx, c, k, tok, 0, "", false); !ok || err != nil {
				t.Errorf("Release = %v, %v; want true", ok, err)
			}
			if keys := m.Keys(); len(keys) != 0 {
				t.Errorf("keys after Release = %q; want none", keys)
			}
			if ok, err := Exists(ctx, c, key); ok || err != nil {
				t.Errorf("Exists after release = %v, %v; want false", ok, err)
			}
			m.Del(key)
			if got, err := Extend(ctx, c, k, tok, time.Second, 0); got != Healed || err != nil {
				t.Errorf("Extend where absent = %v, %v; want Healed", got, err)
			}
			if got, _ := m.Get(key); got != tok || m.TTL(key) != time.Second {
				t.Errorf("healed key = %q ttl %v; want %q ttl 1s", got, m.TTL(key), tok)
			}
		})
	}
}

// A release with a guard deletes the key at once (any client may take it)
// and keeps every later request of the released token from setting it
// again, whatever the key holds when the request lands.
func TestRelease_guard(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ctx := t.Context()
			m, c := newNode(t)
			if err := p.setup(ctx, c); err != nil {
				t.Fatal(err)
			}
			const key, tok, other = "lock:g", "tok-a", "tok-b"
			k, ko := NewKeys(key, "", tok), NewKeys(key, "", other)
			if ok, err := acquire1(ctx, c, k, tok, time.Second); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if ok, err := Release(ctx, c, k, tok, 3*time.Second, "", false); !ok || err != nil {
				t.Fatalf("Release with a guard = %v, %v; want true", ok, err)
			}
			if m.Exists(key) {
				t.Errorf("the lock key survives a release with a guard")
			}
			if got := m.TTL(k.Guard); got != 3*time.Second {
				t.Errorf("guard %q TTL = %v; want 3s", k.Guard, got)
			}
			// Late requests of ours set nothing.
			if ok, err := acquire1(ctx, c, k, tok, time.Second); ok || err != nil {
				t.Errorf("Acquire after our guarded release = %v, %v; want false", ok, err)
			}
			if got, err := Extend(ctx, c, k, tok, time.Second, 0); got != NotOurs || err != nil {
				t.Errorf("Extend after our guarded release = %v, %v; want NotOurs", got, err)
			}
			if m.Exists(key) {
				t.Errorf("a late request of ours set the key again")
			}
			// Another token takes the key at once.
			if ok, err := acquire1(ctx, c, ko, other, time.Second); !ok || err != nil {
				t.Errorf("Acquire by another token after the release = %v, %v; want true", ok, err)
			}
			// A release that finds another token's key still leaves its guard.
			k2 := NewKeys(key, "", "tok-c")
			if ok, err := Release(ctx, c, k2, "tok-c", time.Second, "", false); ok || err != nil {
				t.Errorf("Release of a key held by another = %v, %v; want false", ok, err)
			}
			if !m.Exists(k2.Guard) {
				t.Errorf("a release that matched nothing left no guard")
			}
			if ok, err := Release(ctx, c, ko, other, 0, "", false); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if ok, err := acquire1(ctx, c, k2, "tok-c", time.Second); ok || err != nil {
				t.Errorf("late Acquire over a free key after our guard = %v, %v; want false", ok, err)
			}
			if got, err := Extend(ctx, c, k2, "tok-c", time.Second, 0); got != NotOurs || err != nil {
				t.Errorf("late Extend over a free key after our guard = %v, %v; want NotOurs", got, err)
			}
		})
	}
}

func TestScripts_wrongType(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	if _, err := m.Lpush("lock:list", "x"); err != nil {
		t.Fatal(err)
	}
	if ok, err := acquire1(ctx, c, NewKeys("lock:list", "", "tok"), "tok", time.Second); ok || err == nil {
		t.Errorf("Acquire on a list = %v, %v; want an error (WRONGTYPE), not a refusal", ok, err)
	}
	if _, err := Extend(ctx, c, NewKeys("lock:list", "", "tok"), "tok", time.Second, 0); err == nil {
		t.Errorf("Extend on a list: err = nil; want WRONGTYPE")
	}
	if _, err := Release(ctx, c, NewKeys("lock:list", "", "tok"), "tok", 0, "", false); err == nil {
		t.Errorf("Release on a list: err = nil; want WRONGTYPE")
	}
}

func TestMs(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want int64
	}{{0, 1}, {time.Microsecond, 1}, {time.Millisecond, 1}, {1500 * time.Microsecond, 1}, {3 * time.Second, 3000}}
	for _, tc := range cases {
		if got := ms(tc.d); got != tc.want {
			t.Errorf("ms(%v) = %d; want %d", tc.d, got, tc.want)
		}
	}
}

// acquire1 is Acquire without fencing.
func acquire1(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration) (bool, error) {
	ok, _, err := Acquire(ctx, c, k, token, ttl)
	return ok, err
}

func TestFencing(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	k, kb := NewKeys("lock:f", "lock:f:fence", "a"), NewKeys("lock:f", "lock:f:fence", "b")
	ok, fence, err := Acquire(ctx, c, k, "a", time.Second)
	if !ok || fence != 0 || err != nil {
		t.Fatalf("Acquire on a new resource = %v, %d, %v; want true, 0, nil", ok, fence, err)
	}
	if ok, err := Commit(ctx, c, k, "a", 7); !ok || err != nil {
		t.Fatalf("Commit = %v, %v; want true", ok, err)
	}
	if ok, err := Commit(ctx, c, k, "a", 5); !ok || err != nil {
		t.Fatalf("Commit of a lower t = %v, %v; want true (no-op)", ok, err)
	}
	if got, _ := m.Get("lock:f:fence"); got != "7" {
		t.Errorf("counter = %q; want 7 (max, never lowered)", got)
	}
	ok, fence, err = Acquire(ctx, c, kb, "b", time.Second)
	if ok || fence != 7 || err != nil {
		t.Errorf("Acquire by another = %v, %d, %v; want false, 7 (counter from a refusing node too)", ok, fence, err)
	}
	if ok, err := Commit(ctx, c, kb, "b", 8); ok || err != nil {
		t.Errorf("Commit by a non-owner = %v, %v; want false", ok, err)
	}
	if got, _ := m.Get("lock:f:fence"); got != "7" {
		t.Errorf("counter after a foreign commit = %q; want 7", got)
	}
	// Release never deletes the counter; a node restarted empty is healed
	// with the counter by Extend.
	if ok, err := Release(ctx, c, k, "a", 0, "", false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if !m.Exists("lock:f:fence") {
		t.Errorf("Release deleted the fence counter")
	}
	m.FlushAll()
	if got, err := Extend(ctx, c, k, "a", time.Second, 7); got != Healed || err != nil {
		t.Errorf("Extend on an empty node = %v, %v; want Healed", got, err)
	}
	if got, _ := m.Get("lock:f:fence"); got != "7" {
		t.Errorf("counter after heal = %q; want 7", got)
	}
	if got, err := Extend(ctx, c, kb, "b", time.Second, 9); got != NotOurs || err != nil {
		t.Errorf("Extend by a non-owner = %v, %v; want NotOurs", got, err)
	}
	if got, _ := m.Get("lock:f:fence"); got != "7" {
		t.Errorf("counter after a foreign extend = %q; want 7", got)
	}
}

func TestRelease_wakesOnlyWhenItFreedTheKey(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	k := NewKeys("lock:h", "", "a")
	sub := c.Subscribe(ctx, "lock:h")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatal(err)
	}
	// A release that matches nothing (a failed attempt's cleanup, a late
	// release) publishes nothing.
	if ok, err := Release(ctx, c, k, "a", time.Second, "lock:h", false); ok || err != nil {
		t.Fatal(ok, err)
	}
	k = NewKeys("lock:h", "", "c")
	if ok, err := acquire1(ctx, c, k, "c", time.Second); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := Release(ctx, c, k, "c", 0, "lock:h", false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Channel != "lock:h" || msg.Payload != "1" {
		t.Fatalf("ReceiveMessage = %v, %v; want one message on lock:h saying 1 client waits", msg, err)
	}
	if m.Exists("lock:h") {
		t.Errorf("the key survives a release with a subscriber")
	}
	if ok, err := acquire1(ctx, c, NewKeys("lock:h", "", "w"), "w", time.Second); !ok || err != nil {
		t.Errorf("Acquire after the release = %v, %v; want true", ok, err)
	}
}
