package scripts

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// rwNode is one node the read-write scripts run on: miniredis (whose
// TTLs do not decay: advance moves its clock and its TTLs together) or a
// real redis-server (advance sleeps).
type rwNode struct {
	c       redis.Scripter
	admin   redis.Cmdable
	advance func(d time.Duration)
}

func rwNodes(t *testing.T) map[string]func(t *testing.T) rwNode {
	return map[string]func(t *testing.T) rwNode{
		"miniredis": func(t *testing.T) rwNode {
			m, c := newNode(t)
			now := time.Now()
			m.SetTime(now)
			return rwNode{c: c, admin: c, advance: func(d time.Duration) {
				now = now.Add(d)
				m.SetTime(now)
				m.FastForward(d)
			}}
		},
		"redis-server": func(t *testing.T) rwNode {
			rc := redistest.Start(t, 1)
			return rwNode{c: rc.Client(0), admin: rc.Admin(0), advance: func(d time.Duration) { time.Sleep(d) }}
		},
	}
}

type rwCaller struct {
	k     Keys
	token string
	w     Waiter
}

func reader(tok string, ticket int64, waiting bool) rwCaller {
	c := rwCaller{k: NewReadKeys("lock:rw", tok), token: tok}
	if waiting {
		c.w = Waiter{Member: Member("c", time.Second, tok), Ticket: ticket, Lapse: time.Minute}
	}
	return c
}

func writer(tok string, ticket int64, waiting bool) rwCaller {
	c := rwCaller{k: NewWriteKeys("lock:rw", "", tok), token: tok}
	if waiting {
		c.w = Waiter{Member: Member("c", time.Second, tok), Ticket: ticket, Lapse: time.Minute}
	}
	return c
}

func (r rwCaller) acquire(t *testing.T, c redis.Scripter, ttl time.Duration) bool {
	t.Helper()
	ok, _, err := AcquireWith(t.Context(), c, r.k, AcquireArgs(r.token, ttl, r.w, wake), nil)
	if err != nil {
		t.Fatalf("acquire %s: %v", r.token, err)
	}
	return ok
}

func (r rwCaller) release(t *testing.T, c redis.Scripter) bool {
	t.Helper()
	got, err := ReleaseWith(t.Context(), c, r.k, ReleaseArgs(r.token, 0, r.w, false, wake))
	if err != nil {
		t.Fatalf("release %s: %v", r.token, err)
	}
	return got == Deleted
}

// TestRWScripts: the rule of rw.lua on one node — readers share, a writer
// excludes readers and writers, a waiting writer holds off later readers,
// readers waiting before a writer go first, a reader lapses at its expiry
// by itself — on miniredis and on a real node, by EVALSHA and EVAL.
func TestRWScripts(t *testing.T) {
	for name, mk := range rwNodes(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n := mk(t)
			c := n.c
			ctx := t.Context()
			r1, r2 := reader("r1", 0, false), reader("r2", 0, false)
			w1 := writer("w1", 0, false)
			if !r1.acquire(t, c, time.Minute) || !r2.acquire(t, c, time.Minute) {
				t.Fatal("two readers on a free lock: want both granted")
			}
			if v, _ := n.admin.Get(ctx, "lock:rw").Result(); v != ReadersMarker {
				t.Errorf("lock key with readers = %q; want %q (a foreign writer finds it taken)", v, ReadersMarker)
			}
			if w1.acquire(t, c, time.Minute) {
				t.Fatal("writer granted beside readers")
			}
			if !r1.release(t, c) {
				t.Error("release of reader r1 = not ours; want released")
			}
			if w1.acquire(t, c, time.Minute) {
				t.Fatal("writer granted beside reader r2")
			}
			r2.release(t, c)
			if n, _ := n.admin.Exists(ctx, "lock:rw", "lock:rw"+ReadersSuffix).Result(); n != 0 {
				t.Errorf("keys after the last reader left: %d exist; want none", n)
			}
			if !w1.acquire(t, c, time.Minute) {
				t.Fatal("writer refused on a free lock")
			}
			if r1.acquire(t, c, time.Minute) || writer("w2", 0, false).acquire(t, c, time.Minute) {
				t.Fatal("reader or second writer granted beside a writer")
			}
			if got, err := PrepareExtend(w1.k, "w1", time.Minute, 0).Extend(ctx, c, nil); got != Rearmed || err != nil {
				t.Errorf("writer extend = %v, %v; want Rearmed", got, err)
			}
			if got, err := PrepareExtend(r1.k, "r1", time.Minute, 0).Extend(ctx, c, nil); got != Refused || err != nil {
				t.Errorf("reader extend beside a writer = %v, %v; want Refused", got, err)
			}
			w1.release(t, c)

			// Fairness: the waiting writer (ticket 10) holds off a reader
			// that came later (ticket 20) and a reader that does not wait;
			// a reader that came earlier (ticket 5) goes first.
			rHeld := reader("rh", 0, false)
			rHeld.acquire(t, c, time.Minute)
			wq := writer("wq", 10, true)
			if wq.acquire(t, c, time.Minute) {
				t.Fatal("queued writer granted beside a reader")
			}
			if reader("late", 20, true).acquire(t, c, time.Minute) || reader("try", 0, false).acquire(t, c, time.Minute) {
				t.Fatal("a reader after a waiting writer was granted: writers could starve")
			}
			early := reader("early", 5, true)
			if !early.acquire(t, c, time.Minute) {
				t.Fatal("a reader that came before the waiting writer was refused: readers could starve")
			}
			rHeld.release(t, c)
			early.release(t, c)
			late := reader("late", 20, true)
			if !wq.acquire(t, c, time.Minute) {
				t.Fatal("queued writer refused once the readers left")
			}
			wq.release(t, c)
			// The writer's turn is over: the later reader goes before a
			// writer that came after it.
			w3 := writer("w3", 30, true)
			if w3.acquire(t, c, time.Minute) {
				t.Fatal("writer 30 granted ahead of waiting reader 20")
			}
			if !late.acquire(t, c, time.Minute) {
				t.Fatal("reader 20 refused")
			}
			late.release(t, c)
			if !w3.acquire(t, c, time.Minute) {
				t.Fatal("writer 30 refused on a free lock")
			}
			w3.release(t, c)

			// A crashed reader lapses by itself at its expiry, and so does
			// a waiter that stopped attempting.
			crashed := reader("crashed", 0, false)
			crashed.acquire(t, c, 300*time.Millisecond)
			gone := reader("gone", 40, true)
			gone.w.Lapse = 300 * time.Millisecond
			w4 := writer("w4", 50, true)
			w4.acquire(t, c, time.Minute)
			gone.acquire(t, c, time.Minute) // granted: before w4, beside a reader
			gone.release(t, c)
			g2 := reader("g2", 41, true)
			g2.w.Lapse = 300 * time.Millisecond
			if w4.acquire(t, c, time.Minute) {
				t.Fatal("writer granted beside the crashed reader before its expiry")
			}
			n.advance(600 * time.Millisecond)
			if !w4.acquire(t, c, time.Minute) {
				t.Fatal("writer refused after the crashed reader's expiry")
			}
			w4.release(t, c)
		})
	}
}

// TestRWScriptsHealAndGuard: a reader's and a writer's extension heal a
// node that lost everything (restarted empty), a writer's does not where
// a reader is live, and a request landing after our release (its guard
// set) changes nothing.
func TestRWScriptsHealAndGuard(t *testing.T) {
	t.Parallel()
	m, c := newNode(t)
	ctx := t.Context()
	r, w := reader("r", 0, false), writer("w", 0, false)
	if got, err := PrepareExtend(r.k, "r", time.Minute, 0).Extend(ctx, c, nil); got != Healed || err != nil {
		t.Fatalf("reader extend on an empty node = %v, %v; want Healed", got, err)
	}
	if got, _ := PrepareExtend(w.k, "w", time.Minute, 0).Extend(ctx, c, nil); got != Refused {
		t.Fatalf("writer extend beside a reader = %v; want Refused", got)
	}
	if _, err := ReleaseWith(ctx, c, r.k, ReleaseArgs("r", time.Minute, Waiter{}, false, wake)); err != nil {
		t.Fatal(err)
	}
	if r.acquire(t, c, time.Minute) {
		t.Error("reader granted after its own release (guard set)")
	}
	if got, _ := PrepareExtend(r.k, "r", time.Minute, 0).Extend(ctx, c, nil); got != Refused {
		t.Errorf("reader extend after its release = %v; want Refused", got)
	}
	m.FlushAll()
	if got, err := PrepareExtend(w.k, "w", time.Minute, 0).Extend(ctx, c, nil); got != Healed || err != nil {
		t.Fatalf("writer extend on an empty node = %v, %v; want Healed", got, err)
	}
	m.FlushAll()
	m.HSet("lock:rw"+ReadersSuffix, "f", "v")
	if _, _, err := AcquireWith(ctx, c, r.k, AcquireArgs("r", time.Minute, Waiter{}, wake), nil); err == nil {
		t.Error("reader acquire over a hash: want WRONGTYPE")
	}
}

// TestMultiScripts: all or none on one node.
func TestMultiScripts(t *testing.T) {
	t.Parallel()
	m, c := newNode(t)
	ctx := t.Context()
	acq := func(k Keys, tok string) bool {
		t.Helper()
		ok, _, err := AcquireWith(ctx, c, k, AcquireArgs(tok, time.Minute, Waiter{}, wake), nil)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	ab := NewMultiKeys([]string{"lock:a", "lock:b"}, "t1")
	bc := NewMultiKeys([]string{"lock:b", "lock:c"}, "t2")
	if got := ab.Resources(); got != 2 {
		t.Errorf("Resources() = %d; want 2", got)
	}
	if !acq(ab, "t1") {
		t.Fatal("multi a,b on free keys refused")
	}
	if acq(bc, "t2") {
		t.Fatal("multi b,c granted while b is held")
	}
	if m.Exists("lock:c") {
		t.Error("refused multi-lock set lock:c: want none set (all or none)")
	}
	m.Del("lock:a") // the node lost one key
	if got, _ := PrepareExtend(ab, "t1", time.Minute, 0).Extend(ctx, c, nil); got != Healed {
		t.Errorf("extend with a key gone = %v; want Healed", got)
	}
	if got, _ := ReleaseWith(ctx, c, ab, ReleaseArgs("t1", 0, Waiter{}, false, wake)); got != Deleted {
		t.Errorf("release = %v; want Deleted", got)
	}
	if !acq(bc, "t2") {
		t.Fatal("multi b,c refused after a,b released")
	}
	many := make([]string, 12)
	for i := range many {
		many[i] = "lock:m" + string(rune('a'+i))
	}
	if !acq(NewMultiKeys(many, "t3"), "t3") {
		t.Error("multi over 12 keys refused")
	}
}
