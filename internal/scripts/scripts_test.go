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
		for _, s := range []*redis.Script{acquire, extend, release, exists} {
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

			if ok, err := Acquire(ctx, c, key, tok, time.Second); !ok || err != nil {
				t.Fatalf("Acquire on empty = %v, %v; want true, nil", ok, err)
			}
			if ok, err := Acquire(ctx, c, key, tok, 5*time.Second); !ok || err != nil {
				t.Fatalf("Acquire again with our token = %v, %v; want true, nil (idempotent)", ok, err)
			}
			if got := m.TTL(key); got != 5*time.Second {
				t.Errorf("TTL after refresh = %v; want 5s", got)
			}
			if ok, err := Acquire(ctx, c, key, other, time.Second); ok || err != nil {
				t.Fatalf("Acquire by another token = %v, %v; want false, nil", ok, err)
			}
			if got, err := Extend(ctx, c, key, other, time.Second); got != NotOurs || err != nil {
				t.Errorf("Extend by another token = %v, %v; want NotOurs", got, err)
			}
			if got, err := Extend(ctx, c, key, tok, 7*time.Second); got != Rearmed || err != nil {
				t.Errorf("Extend = %v, %v; want Rearmed", got, err)
			}
			if got := m.TTL(key); got != 7*time.Second {
				t.Errorf("TTL after Extend = %v; want 7s", got)
			}
			if ok, err := Exists(ctx, c, key); !ok || err != nil {
				t.Errorf("Exists = %v, %v; want true", ok, err)
			}
			if ok, err := Release(ctx, c, key, other); ok || err != nil {
				t.Errorf("Release by another token = %v, %v; want false", ok, err)
			}
			if got, _ := m.Get(key); got != tok {
				t.Errorf("key after foreign Release = %q; want %q", got, tok)
			}
			if ok, err := Release(ctx, c, key, tok); !ok || err != nil {
				t.Errorf("Release = %v, %v; want true", ok, err)
			}
			if m.Exists(key) {
				t.Errorf("key exists after Release")
			}
			if ok, err := Exists(ctx, c, key); ok || err != nil {
				t.Errorf("Exists after release = %v, %v; want false", ok, err)
			}
			if got, err := Extend(ctx, c, key, tok, time.Second); got != Healed || err != nil {
				t.Errorf("Extend where absent = %v, %v; want Healed", got, err)
			}
			if got, _ := m.Get(key); got != tok || m.TTL(key) != time.Second {
				t.Errorf("healed key = %q ttl %v; want %q ttl 1s", got, m.TTL(key), tok)
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
	if ok, err := Acquire(ctx, c, "lock:list", "tok", time.Second); ok || err == nil {
		t.Errorf("Acquire on a list = %v, %v; want an error (WRONGTYPE), not a refusal", ok, err)
	}
	if _, err := Extend(ctx, c, "lock:list", "tok", time.Second); err == nil {
		t.Errorf("Extend on a list: err = nil; want WRONGTYPE")
	}
	if _, err := Release(ctx, c, "lock:list", "tok"); err == nil {
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
