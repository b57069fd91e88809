package scripts

import (
	"context"
	"errors"
	"strconv"
	"strings"
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
		for _, s := range []script{acquire, commit, extend, release, exists} {
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
			if got, err := Extend(ctx, c, ko, other, time.Second, 0); got != Refused || err != nil {
				t.Errorf("Extend by another token = %v, %v; want Refused", got, err)
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
			if ok, err := release1(ctx, c, ko, other, 0); ok || err != nil {
				t.Errorf("Release by another token = %v, %v; want false", ok, err)
			}
			if got, _ := m.Get(key); got != tok {
				t.Errorf("key after foreign Release = %q; want %q", got, tok)
			}
			if m.Exists(ko.Guard) {
				t.Errorf("a release without a guard left the guard key %q", ko.Guard)
			}
			// Released with no request in flight: deleted, nothing left.
			if ok, err := release1(ctx, c, k, tok, 0); !ok || err != nil {
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
			if ok, err := release1(ctx, c, k, tok, 3*time.Second); !ok || err != nil {
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
			if got, err := Extend(ctx, c, k, tok, time.Second, 0); got != Refused || err != nil {
				t.Errorf("Extend after our guarded release = %v, %v; want Refused", got, err)
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
			if ok, err := release1(ctx, c, k2, "tok-c", time.Second); ok || err != nil {
				t.Errorf("Release of a key held by another = %v, %v; want false", ok, err)
			}
			if !m.Exists(k2.Guard) {
				t.Errorf("a release that matched nothing left no guard")
			}
			if ok, err := release1(ctx, c, ko, other, 0); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if ok, err := acquire1(ctx, c, k2, "tok-c", time.Second); ok || err != nil {
				t.Errorf("late Acquire over a free key after our guard = %v, %v; want false", ok, err)
			}
			if got, err := Extend(ctx, c, k2, "tok-c", time.Second, 0); got != Refused || err != nil {
				t.Errorf("late Extend over a free key after our guard = %v, %v; want Refused", got, err)
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
	if _, err := release1(ctx, c, NewKeys("lock:list", "", "tok"), "tok", 0); err == nil {
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

// wake is the wake-up argument of the tests' scripts: channels
// "lock:wake:<client>", whose listeners the node counts.
var wake = WakeArg("lock:wake:", true)

// release1 is Release without a queue, reporting whether the key was freed.
func release1(ctx context.Context, c redis.Scripter, k Keys, token string, guard time.Duration) (bool, error) {
	r, err := Release(ctx, c, k, token, guard, Waiter{}, false, wake)
	return r == Deleted || r == HandedOver, err
}

// acquire1 is Acquire without fencing.
func acquire1(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration) (bool, error) {
	ok, _, err := Acquire(ctx, c, k, token, ttl, Waiter{}, wake)
	return ok, err
}

func TestFencing(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	k, kb := NewKeys("lock:f", "lock:f:fence", "a"), NewKeys("lock:f", "lock:f:fence", "b")
	ok, fence, err := Acquire(ctx, c, k, "a", time.Second, Waiter{}, wake)
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
	ok, fence, err = Acquire(ctx, c, kb, "b", time.Second, Waiter{}, wake)
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
	if ok, err := release1(ctx, c, k, "a", 0); !ok || err != nil {
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
	if got, err := Extend(ctx, c, kb, "b", time.Second, 9); got != Refused || err != nil {
		t.Errorf("Extend by a non-owner = %v, %v; want Refused", got, err)
	}
	if got, _ := m.Get("lock:f:fence"); got != "7" {
		t.Errorf("counter after a foreign extend = %q; want 7", got)
	}
}

// The queue: a refused waiter queues; a release hands the key to the
// oldest ticket, for that waiter's reservation, and tells its client alone; a
// waiter whose client does not listen is dropped; a free key goes to the
// head; a yield settles a split toward the older ticket; the queue key
// expires after its latest newcomer.
func TestQueue(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:q", "lock:wake:"
	w := func(client, token string, ticket int64) Waiter {
		return Waiter{Member: Member(client, 5*time.Second, token), Ticket: ticket, Lapse: 10 * time.Second}
	}
	listen := func(client string) *redis.PubSub {
		sub := c.Subscribe(ctx, prefix+client)
		t.Cleanup(func() { sub.Close() })
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	kh, ka, kb := NewKeys(key, "", "h"), NewKeys(key, "", "a"), NewKeys(key, "", "b")
	if ok, _, err := Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// Two waiters queue, b with the older ticket.
	for _, x := range []struct {
		k   Keys
		tok string
		w   Waiter
	}{{ka, "a", w("ca", "a", 20)}, {kb, "b", w("cb", "b", 10)}} {
		if ok, _, err := Acquire(ctx, c, x.k, x.tok, time.Second, x.w, wake); ok || err != nil {
			t.Fatalf("Acquire by waiter %s on a held key = %v, %v; want refused", x.tok, ok, err)
		}
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 2 {
		t.Fatalf("queue = %q; want both waiters", got)
	}
	subB := listen("cb")
	// The holder releases: the key goes to b (oldest ticket) for b's reservation,
	// and b's client is told.
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != HandedOver || err != nil {
		t.Fatalf("Release with waiters = %v, %v; want HandedOver", r, err)
	}
	if v, _ := m.Get(key); v != "b" || m.TTL(key) != 5*time.Second {
		t.Errorf("key after the handoff = %q ttl %v; want b for its reservation 5s", v, m.TTL(key))
	}
	msg, err := subB.ReceiveMessage(ctx)
	if tok, _ := ParseHandoff(msg.Payload); err != nil || tok != "b" {
		t.Fatalf("message on b's channel = %v, %v; want b's token", msg, err)
	}
	// The holder cannot take it back; b's attempt finds it ours.
	if ok, _, _ := Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake); ok {
		t.Errorf("the releaser took the handed key back")
	}
	if ok, _, err := Acquire(ctx, c, kb, "b", 5*time.Second, w("cb", "b", 10), wake); !ok || err != nil {
		t.Fatalf("b's attempt on its handed key = %v, %v; want granted", ok, err)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 1 || !strings.HasPrefix(got[0], EntryPrefix(Member("ca", 5*time.Second, "a"))) {
		t.Errorf("queue after the handoff = %q; want a alone", got)
	}
	// b's Unlock: a's client does not listen (PUBLISH reaches nobody), so
	// a is dropped (its process is gone) and the key is deleted at once.
	if r, err := Release(ctx, c, kb, "b", 0, w("cb", "b", 10), false, wake); r != Deleted || err != nil {
		t.Fatalf("b's Release with only a waiter nobody listens for = %v, %v; want Deleted", r, err)
	}
	if keys := m.Keys(); len(keys) != 0 {
		t.Errorf("keys left = %q; want none", keys)
	}

	// A free key with a queue goes to the head: an attempt that may not
	// go first hands it over.
	listen("ca")
	if ok, _, _ := Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake); !ok {
		t.Fatal("Acquire on a free key, nobody queued: refused")
	}
	if ok, _, _ := Acquire(ctx, c, ka, "a", time.Second, w("ca", "a", 20), wake); ok {
		t.Fatal("a granted a held key")
	}
	m.Del(key) // the holder's key expires
	if ok, _, _ := Acquire(ctx, c, kb, "b", time.Second, w("cb", "b", 30), wake); ok {
		t.Errorf("a younger waiter took a free key ahead of the queued a")
	}
	if v, _ := m.Get(key); v != "a" {
		t.Errorf("free key after a younger waiter's attempt = %q; want handed to the head a", v)
	}
	if ok, _, _ := Acquire(ctx, c, ka, "a", time.Second, w("ca", "a", 20), wake); !ok {
		t.Errorf("the head was refused its handed key")
	}
	// An older ticket goes first on a free key.
	m.FlushAll()
	Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake)
	Acquire(ctx, c, ka, "a", time.Second, w("ca", "a", 20), wake)
	m.Del(key)
	if ok, _, _ := Acquire(ctx, c, kb, "b", time.Second, w("cb", "b", 5), wake); !ok {
		t.Errorf("an older ticket was refused a free key queued for a younger one")
	}

	// A yield: b, older than the head c, keeps its key; c yields to b.
	m.FlushAll()
	kc := NewKeys(key, "", "c")
	Acquire(ctx, c, kc, "c", time.Second, w("cc", "c", 50), wake)
	Acquire(ctx, c, kb, "b", time.Second, w("cb", "b", 10), wake) // queued behind c's key
	if r, err := Release(ctx, c, kc, "c", 0, w("cc", "c", 50), true, wake); r != HandedOver || err != nil {
		t.Fatalf("c yielding to the older b = %v, %v; want HandedOver", r, err)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 1 || !strings.HasPrefix(got[0], EntryPrefix(Member("cc", 5*time.Second, "c"))) {
		t.Errorf("queue after c yielded = %q; want c queued", got)
	}
	if r, err := Release(ctx, c, kb, "b", 0, w("cb", "b", 10), true, wake); r != Kept || err != nil {
		t.Errorf("b yielding with no older waiter = %v, %v; want Kept", r, err)
	}
	// Yielding to an older waiter nobody listens for: it is dropped, and
	// the key stays ours with its TTL.
	m.FlushAll()
	Acquire(ctx, c, kc, "c", 3*time.Second, w("cc", "c", 50), wake)
	kd := NewKeys(key, "", "d")
	Acquire(ctx, c, kd, "d", time.Second, w("cd", "d", 1), wake)
	if r, err := Release(ctx, c, kc, "c", 0, w("cc", "c", 50), true, wake); r != Kept || err != nil {
		t.Fatalf("c yielding to an older waiter nobody listens for = %v, %v; want Kept", r, err)
	}
	if v, _ := m.Get(key); v != "c" || m.TTL(key) <= 2*time.Second {
		t.Errorf("key after the yield = %q ttl %v; want c's, with its TTL", v, m.TTL(key))
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 0 {
		t.Errorf("queue after the yield = %q; want the dead waiter dropped", got)
	}

	// A yield that lands after the token's guarded release (the call gave
	// up on it) does not queue the token again.
	m.FlushAll()
	Acquire(ctx, c, kc, "c", time.Second, w("cc", "c", 50), wake)
	Acquire(ctx, c, kd, "d", time.Second, w("cd", "d", 1), wake)
	listen("cd")
	Release(ctx, c, kc, "c", time.Second, w("cc", "c", 50), false, wake) // the abandon, guarded
	if r, err := Release(ctx, c, kc, "c", 0, w("cc", "c", 50), true, wake); r != NotOurs || err != nil {
		t.Fatalf("late yield = %v, %v; want NotOurs", r, err)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 0 {
		t.Errorf("queue after a late yield of a released token = %q; want empty", got)
	}

	// A released token never queues again (a late attempt of a Lock call
	// that is over): a release would hand the key to a dead token.
	m.FlushAll()
	Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake)
	kz := NewKeys(key, "", "z")
	if _, err := Release(ctx, c, kz, "z", time.Second, w("cz", "z", 1), false, wake); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := Acquire(ctx, c, kz, "z", time.Second, w("cz", "z", 1), wake); ok || err != nil {
		t.Fatalf("late Acquire of a released token = %v, %v; want refused", ok, err)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 0 {
		t.Errorf("queue after a released token's late attempt = %q; want empty", got)
	}
	m.Set(key, "z") // handed to it somehow: a late request still changes nothing
	if ok, _, _ := Acquire(ctx, c, kz, "z", time.Second, Waiter{}, wake); ok {
		t.Errorf("late Acquire of a released token over its own key = granted; want refused")
	}
	if got, err := Extend(ctx, c, kz, "z", time.Second, 0); got != Refused || err != nil {
		t.Errorf("late Extend of a released token over its own key = %v, %v; want Refused", got, err)
	}

	// Where listeners cannot be counted (a Redis Cluster node), the head is
	// handed the key without that check.
	m.FlushAll()
	Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake)
	Acquire(ctx, c, ka, "a", time.Second, w("nobody", "a", 1), wake)
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, WakeArg(prefix, false)); r != HandedOver || err != nil {
		t.Fatalf("Release without counting listeners = %v, %v; want HandedOver", r, err)
	}
	if v, _ := m.Get(key); v != "a" {
		t.Errorf("key after a handoff without counting listeners = %q; want a", v)
	}

	// The queue keys outlive the latest entry's lapse (twice it, when re-armed).
	m.FlushAll()
	Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake)
	Acquire(ctx, c, ka, "a", time.Second, Waiter{Member: Member("ca", time.Second, "a"), Ticket: 1, Lapse: 700 * time.Millisecond}, wake)
	if ttl := m.TTL(key + QueueSuffix); ttl != 1400*time.Millisecond || m.Exists(key+LapseSuffix) {
		t.Errorf("queue TTL = %v, lapse hash %v; want twice the lapse 700ms, and no hash (the old form's)", ttl, m.Exists(key+LapseSuffix))
	}

	// The limit of PUBLISH's count: a pattern subscriber on the channels
	// (a monitoring tool, say) counts as a receiver, so a waiter whose
	// client is gone is handed the key all the same (for one reservation).
	m.FlushAll()
	Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake)
	Acquire(ctx, c, ka, "a", time.Second, w("gone", "a", 1), wake)
	ps := c.PSubscribe(ctx, prefix+"*")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != HandedOver || err != nil {
		t.Errorf("Release with a pattern subscriber listening = %v, %v; want HandedOver (the documented limit)", r, err)
	}
}

func FuzzParseAcquire(f *testing.F) {
	f.Add(int64(1), int64(0), false)
	f.Add(int64(0), int64(7), true)
	f.Add(int64(-1), int64(3), true)
	f.Add(int64(-2), int64(4), true)
	f.Add(int64(-2), int64(0), false)
	f.Add(int64(5), int64(-9), true)
	f.Fuzz(func(t *testing.T, a, b int64, pair bool) {
		var v any = a
		if pair {
			v = []any{a, b}
		}
		ok, n, young, err := parseAcquire(v)
		switch {
		case errors.Is(err, ErrLate):
			if a != lateAcquire {
				t.Errorf("parseAcquire(%v) = ErrLate; want it only from -2 or {-2, n}", v)
			}
		case err != nil:
			if ok || young {
				t.Errorf("parseAcquire(%v) = %v, %v, %v, %v; want nothing with an error", v, ok, n, young, err)
			}
		case young:
			if !pair || a != -1 {
				t.Errorf("parseAcquire(%v) young; want only from {-1, n}", v)
			}
		case ok != (a == 1):
			t.Errorf("parseAcquire(%v) = %v; want %v", v, ok, a == 1)
		}
	})
}

func FuzzParseReplies(f *testing.F) {
	f.Add(int64(0))
	f.Add(int64(3))
	f.Add(int64(-1))
	f.Fuzz(func(t *testing.T, n int64) {
		if r, err := parseReleased(n, nil); (err == nil) != (n >= 0 && n <= 3) || (err != nil && r != NotOurs) {
			t.Errorf("parseReleased(%d) = %v, %v", n, r, err)
		}
		if e, err := parseExtended(n, nil); (err == nil) != (n >= 0 && n <= 2) || (err != nil && e != Refused) || errors.Is(err, ErrLate) != (n == -1) {
			t.Errorf("parseExtended(%d) = %v, %v", n, e, err)
		}
	})
}

// A release serves the first waiter that can take the key: dead waiters
// (nobody listens on their client's channel) and entries it cannot read
// are dropped on the way, in the same step. A key of another type is never
// served or taken, queue or not.
func TestQueue_serveSkipsToALiveWaiter(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:s", "lock:wake:"
	kh, ka := NewKeys(key, "", "h"), NewKeys(key, "", "a")
	if ok, _, err := Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake); !ok || err != nil {
		t.Fatal(ok, err)
	}
	queue := key + QueueSuffix
	m.ZAdd(queue, 1, Member("gone", 5*time.Second, "d")) // its client does not listen
	m.ZAdd(queue, 2, "no-slashes-here")                  // unreadable
	if ok, _, err := Acquire(ctx, c, ka, "a", time.Second, Waiter{Member: Member("ca", 5*time.Second, "a"), Ticket: 3, Lapse: 10 * time.Second}, wake); ok || err != nil {
		t.Fatalf("a's attempt on a held key = %v, %v; want refused and queued", ok, err)
	}
	sub := c.Subscribe(ctx, prefix+"ca")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != HandedOver || err != nil {
		t.Fatalf("Release = %v, %v; want HandedOver to a", r, err)
	}
	if v, _ := m.Get(key); v != "a" || m.TTL(key) != 5*time.Second {
		t.Errorf("key = %q ttl %v; want a's for its reservation 5s", v, m.TTL(key))
	}
	if got, _ := m.ZMembers(queue); len(got) != 0 {
		t.Errorf("queue = %q; want the dead and unreadable entries dropped, and a served", got)
	}
	if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != "a 0" {
		t.Errorf("message on a's channel = %v, %v; want a's token", msg, err)
	}

	// A key of another type, with waiters queued: an error, and nothing
	// is served or changed.
	m.FlushAll()
	m.Lpush(key, "x")
	m.ZAdd(queue, 1, Member("ca", 5*time.Second, "a"))
	if ok, _, err := Acquire(ctx, c, kh, "h", time.Second, Waiter{}, wake); ok || err == nil {
		t.Errorf("Acquire on a list with waiters = %v, %v; want WRONGTYPE", ok, err)
	}
	if got, _ := m.ZMembers(queue); len(got) != 1 {
		t.Errorf("queue = %q; want the waiter still queued", got)
	}
	if typ := m.Type(key); typ != "list" {
		t.Errorf("key type = %q; want the list untouched", typ)
	}
}

// Each queue entry lapses on its own deadline (DESIGN step 9): a waiter
// that stopped attempting is passed over once its lapse is past, while one
// whose attempts refresh it is served; a waiter with a short lapse does not
// shorten the queue keys' life for the others.
func TestQueue_entriesLapseOnTheirOwn(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:lapse", "lock:wake:"
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	m.SetTime(now)
	for _, client := range []string{"cold", "warm"} {
		sub := c.Subscribe(ctx, prefix+client)
		t.Cleanup(func() { sub.Close() })
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	kh, kc, kw := NewKeys(key, "", "h"), NewKeys(key, "", "c"), NewKeys(key, "", "w")
	Acquire(ctx, c, kh, "h", time.Minute, Waiter{}, wake)
	cold := Waiter{Member: Member("cold", time.Second, "c"), Ticket: 1, Lapse: 3 * time.Second, Attempt: 1}
	warm := Waiter{Member: Member("warm", time.Second, "w"), Ticket: 2, Lapse: 10 * time.Second, Attempt: 1}
	Acquire(ctx, c, kc, "c", time.Minute, cold, wake)
	Acquire(ctx, c, kw, "w", time.Minute, warm, wake)
	// The short lapse of a later attempt does not shorten the keys' life.
	Acquire(ctx, c, kc, "c", time.Minute, cold, wake)
	if ttl := m.TTL(key + QueueSuffix); ttl < 10*time.Second {
		t.Errorf("queue TTL after a short-lapse attempt = %v; want the longest lapse, 10s", ttl)
	}
	// 5s later: cold's entry lapsed (3s), warm's attempt refreshed its own.
	m.SetTime(now.Add(5 * time.Second))
	warm.Attempt = 7
	Acquire(ctx, c, kw, "w", time.Minute, warm, wake)
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != HandedOver || err != nil {
		t.Fatalf("Release = %v, %v; want HandedOver", r, err)
	}
	if v, _ := m.Get(key); v != "w" {
		t.Errorf("key after the release = %q; want the live waiter w, past the lapsed entry of c", v)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 0 {
		t.Errorf("queue = %q; want the lapsed entry dropped and w served", got)
	}
}

// Equal tickets are ordered by member, the same way wherever the order is
// read: the caller that comes first in (ticket, member) goes first on a
// free key, and keeps a key it yields; the other hands over.
func TestQueue_equalTicketsFollowOneOrder(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:tie", "lock:wake:"
	for _, client := range []string{"ca", "cb"} {
		sub := c.Subscribe(ctx, prefix+client)
		t.Cleanup(func() { sub.Close() })
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ka, kb := NewKeys(key, "", "a"), NewKeys(key, "", "b")
	wa := Waiter{Member: Member("ca", time.Second, "a"), Ticket: 5, Lapse: 10 * time.Second, Attempt: 1}
	wb := Waiter{Member: Member("cb", time.Second, "b"), Ticket: 5, Lapse: 10 * time.Second, Attempt: 1}
	// a holds the key, b is queued with the same ticket.
	if ok, _, _ := Acquire(ctx, c, ka, "a", time.Minute, wa, wake); !ok {
		t.Fatal("a refused on a free key")
	}
	Acquire(ctx, c, kb, "b", time.Minute, wb, wake)
	// a (member "ca/…" < "cb/…") comes first: its yield keeps the key.
	if r, err := Release(ctx, c, ka, "a", 0, wa, true, wake); r != Kept || err != nil {
		t.Fatalf("yield of the first in the order = %v, %v; want Kept", r, err)
	}
	if ttl := m.TTL(key); ttl != time.Second {
		t.Errorf("key kept by a yield: TTL %v; want the yielder's reservation 1s, not its TTL", ttl)
	}
	// b holding, a queued: b's yield hands the key to a.
	m.FlushAll()
	Acquire(ctx, c, kb, "b", time.Minute, wb, wake)
	Acquire(ctx, c, ka, "a", time.Minute, wa, wake)
	if r, err := Release(ctx, c, kb, "b", 0, wb, true, wake); r != HandedOver || err != nil {
		t.Fatalf("yield of the second in the order = %v, %v; want HandedOver", r, err)
	}
	if v, _ := m.Get(key); v != "a" {
		t.Errorf("key after b's yield = %q; want a", v)
	}
	// A free key with b queued: a goes first; with a queued, b does not.
	m.FlushAll()
	Acquire(ctx, c, NewKeys(key, "", "h"), "h", time.Minute, Waiter{}, wake)
	Acquire(ctx, c, kb, "b", time.Minute, wb, wake)
	m.Del(key)
	if ok, _, _ := Acquire(ctx, c, ka, "a", time.Minute, wa, wake); !ok {
		t.Errorf("a, first in the order, refused on a free key with b queued")
	}
	m.FlushAll()
	Acquire(ctx, c, NewKeys(key, "", "h"), "h", time.Minute, Waiter{}, wake)
	Acquire(ctx, c, ka, "a", time.Minute, wa, wake)
	m.Del(key)
	if ok, _, _ := Acquire(ctx, c, kb, "b", time.Minute, wb, wake); ok {
		t.Errorf("b, second in the order, took a free key with a queued")
	}
	if v, _ := m.Get(key); v != "a" {
		t.Errorf("key = %q; want it handed to a", v)
	}
}

// A release that finds its key gone (expired) hands the free key to the
// first live waiter, and names the waiter's attempt in the message.
func TestQueue_releaseOfAGoneKeyServes(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:gone", "lock:wake:"
	sub := c.Subscribe(ctx, prefix+"cw")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	kh, kw := NewKeys(key, "", "h"), NewKeys(key, "", "w")
	Acquire(ctx, c, kh, "h", time.Minute, Waiter{}, wake)
	Acquire(ctx, c, kw, "w", time.Minute, Waiter{Member: Member("cw", 2*time.Second, "w"), Ticket: 1, Lapse: 10 * time.Second, Attempt: 4}, wake)
	m.Del(key) // h's lease ran out
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != NotOurs || err != nil {
		t.Fatalf("Release of a gone key = %v, %v; want NotOurs", r, err)
	}
	if v, _ := m.Get(key); v != "w" || m.TTL(key) != 2*time.Second {
		t.Errorf("key = %q ttl %v; want w for its reservation 2s", v, m.TTL(key))
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tok, n := ParseHandoff(msg.Payload); tok != "w" || n != 4 {
		t.Errorf("handoff message = %q (token %q, attempt %d); want w's token and attempt 4", msg.Payload, tok, n)
	}
}

// An entry queued by an older version of the library (no lapse field)
// counts as live: it is served, and its message names attempt 0.
func TestQueue_legacyEntryIsServed(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:legacy", "lock:wake:"
	sub := c.Subscribe(ctx, prefix+"old")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	kh := NewKeys(key, "", "h")
	Acquire(ctx, c, kh, "h", time.Minute, Waiter{}, wake)
	m.ZAdd(key+QueueSuffix, 1, Member("old", 30*time.Second, "o"))
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != HandedOver || err != nil {
		t.Fatalf("Release with a legacy entry queued = %v, %v; want HandedOver", r, err)
	}
	if v, _ := m.Get(key); v != "o" {
		t.Errorf("key = %q; want the legacy waiter's token", v)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tok, n := ParseHandoff(msg.Payload); tok != "o" || n != 0 {
		t.Errorf("message = %q; want token o, attempt 0", msg.Payload)
	}
}

// The rolling upgrade (issue 32): entries of the old form, with their
// deadline and attempt in the lapse hash, are read (a lapsed one dropped,
// a live one served and taken out of the hash); a waiter's later attempts
// replace its entry, whatever form the others have, and the new scripts
// write no hash.
func TestQueue_oldFormWithLapseHash(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key, prefix = "lock:mixed", "lock:wake:"
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	m.SetTime(now)
	sub := c.Subscribe(ctx, prefix+"old")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	kh, kn := NewKeys(key, "", "h"), NewKeys(key, "", "n")
	Acquire(ctx, c, kh, "h", time.Minute, Waiter{}, wake)
	lapsed, live := Member("old", time.Second, "x"), Member("old", time.Second, "o")
	m.ZAdd(key+QueueSuffix, 1, lapsed)
	m.ZAdd(key+QueueSuffix, 2, live)
	m.HSet(key+LapseSuffix, lapsed, strconv.FormatInt(now.UnixMilli()-1, 10)+" 3")
	m.HSet(key+LapseSuffix, live, strconv.FormatInt(now.UnixMilli()+5000, 10)+" 4")
	// While the old form's hash exists (an old version queues on this key),
	// a new waiter is written in the old form, its field in the hash, so
	// that an old release serves it rather than drop it at the head.
	m.SetTTL(key+LapseSuffix, 9*time.Second)
	nw := Waiter{Member: Member("new", time.Second, "n"), Ticket: 3, Lapse: 10 * time.Second, Attempt: 1, Fresh: true}
	Acquire(ctx, c, kn, "n", time.Minute, nw, wake)
	nw.Attempt, nw.Fresh = 2, false
	Acquire(ctx, c, kn, "n", time.Minute, nw, wake)
	got, _ := m.ZMembers(key + QueueSuffix)
	if len(got) != 3 || got[2] != nw.Member {
		t.Fatalf("queue = %q; want the two old entries and the new waiter's, in the old form, once", got)
	}
	if f := m.HGet(key+LapseSuffix, nw.Member); f != strconv.FormatInt(now.UnixMilli()+10000, 10)+" 2" {
		t.Errorf("the new waiter's field = %q; want its lapse deadline and latest attempt", f)
	}
	if ttl := m.TTL(key + LapseSuffix); ttl != 9*time.Second {
		t.Errorf("hash TTL = %v; want 9s: raised only by the old scripts, so that it lapses once they stop", ttl)
	}
	if r, err := Release(ctx, c, kh, "h", 0, Waiter{}, false, wake); r != HandedOver || err != nil {
		t.Fatalf("Release = %v, %v; want HandedOver", r, err)
	}
	if v, _ := m.Get(key); v != "o" {
		t.Errorf("key = %q; want the live old-form waiter o, past the lapsed one", v)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if tok, n := ParseHandoff(msg.Payload); err != nil || tok != "o" || n != 4 {
		t.Errorf("message = %q, %v; want token o, attempt 4 (from the hash)", msg.Payload, err)
	}
	if f, _ := m.HKeys(key + LapseSuffix); len(f) != 1 || f[0] != nw.Member {
		t.Errorf("lapse hash fields left = %q; want the served and dropped ones taken out, the new waiter's kept", f)
	}
	// The hash gone (no old version queues any more), the waiter's next
	// attempt replaces its old-form entry with one of the new form.
	m.Del(key + LapseSuffix)
	nw.Attempt = 3
	Acquire(ctx, c, kn, "n", time.Minute, nw, wake)
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 1 || !strings.HasPrefix(got[0], EntryPrefix(nw.Member)) || !strings.HasSuffix(got[0], "#3") {
		t.Fatalf("queue = %q; want the new waiter's entry alone, in the new form", got)
	}
	if m.Exists(key + LapseSuffix) {
		t.Errorf("the lapse hash was written again; want it left alone once gone")
	}
	// The new waiter leaves: its entry goes, found by its ticket.
	if err := Leave(ctx, c, kn, nw); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 0 {
		t.Errorf("queue after Leave = %q; want empty", got)
	}
	// A hash without a TTL (left by a version before the old one) gets
	// one, so that it cannot keep the old form written for ever; an old-form
	// entry of ours leaves with its field.
	m.HSet(key+LapseSuffix, "older/1000/z", "0 0")
	nw.Attempt, nw.Fresh = 4, true
	Acquire(ctx, c, kn, "n", time.Minute, nw, wake)
	if ttl := m.TTL(key + LapseSuffix); ttl != 20*time.Second {
		t.Errorf("hash TTL = %v; want twice the lapse, 20s", ttl)
	}
	if err := Leave(ctx, c, kn, nw); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.ZMembers(key + QueueSuffix); len(got) != 0 {
		t.Errorf("queue after Leave = %q; want empty", got)
	}
	if f := m.HGet(key+LapseSuffix, nw.Member); f != "" {
		t.Errorf("the new waiter's field after Leave = %q; want none", f)
	}
}

// PrepareRearm re-arms where the key holds our token and sets nothing
// where it is absent (issue 44 item 5: Resume's round must not revive a key
// that expired after Resume read it).
func TestRearm_neverHeals(t *testing.T) {
	if rearm.Hash() == extend.Hash() {
		t.Fatal("rearm is extend: the heal branch of extend.lua was not found")
	}
	ctx := t.Context()
	m, c := newNode(t)
	const key, tok = "lock:r", "tok-a"
	k := NewKeys(key, "", tok)
	if got, err := PrepareRearm(k, tok, 5*time.Second).Extend(ctx, c, nil); got != Refused || err != nil {
		t.Errorf("Rearm of an absent key = %v, %v; want Refused, nil", got, err)
	}
	if m.Exists(key) {
		t.Fatal("Rearm set an absent key")
	}
	if ok, err := acquire1(ctx, c, k, tok, time.Second); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got, err := PrepareRearm(k, tok, 5*time.Second).Extend(ctx, c, nil); got != Extended(1) || err != nil {
		t.Errorf("Rearm of our key = %v, %v; want re-armed (1), nil", got, err)
	}
	if got := m.TTL(key); got != 5*time.Second {
		t.Errorf("TTL after Rearm = %v; want 5s", got)
	}
}
