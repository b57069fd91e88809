package scripts

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// nodeMS returns node c's clock, in Unix ms.
func nodeMS(t *testing.T, c redis.Cmdable) int64 {
	t.Helper()
	tm, err := c.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

// TestNotAfter: a request whose not-after bound the node's clock has
// passed changes nothing (DESIGN step 4) — no grant, no refresh, no queue
// entry, no extension, no heal — on the plain, fenced and guarded scripts;
// one whose bound is ahead runs as if it had none.
func TestNotAfter(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 1)
	c, admin := rc.Client(0), rc.Admin(0)
	ctx := t.Context()
	past := func() *int64 { b := nodeMS(t, admin) - 1; return &b }
	ahead := func() *int64 { b := nodeMS(t, admin) + 60_000; return &b }

	t.Run("acquire", func(t *testing.T) {
		k := NewKeys("lock:na", "", "tok")
		w := Waiter{Member: Member("c", time.Second, "tok"), Ticket: 1, Lapse: time.Minute, Attempt: 1}
		args := AcquireArgs("tok", time.Minute, w, wake)
		if ok, _, err := AcquireWith(ctx, c, k, args, past()); ok || !errors.Is(err, ErrLate) {
			t.Fatalf("AcquireWith(past bound) = %v, %v; want false, ErrLate", ok, err)
		}
		if n, _ := admin.Exists(ctx, k.Lock, k.Queue, k.Lapse).Result(); n != 0 {
			t.Fatalf("keys after a late acquire: %d exist; want none (no grant, no queue entry)", n)
		}
		if ok, _, err := AcquireWith(ctx, c, k, args, ahead()); !ok || err != nil {
			t.Fatalf("AcquireWith(bound ahead) = %v, %v; want true, nil", ok, err)
		}
		admin.PExpire(ctx, k.Lock, time.Second)
		if ok, _, err := AcquireWith(ctx, c, k, args, past()); ok || !errors.Is(err, ErrLate) {
			t.Fatalf("AcquireWith(past bound) of a key held = %v, %v; want false, ErrLate", ok, err)
		}
		if d, _ := admin.PTTL(ctx, k.Lock).Result(); d > time.Second {
			t.Errorf("PTTL after a late refresh = %v; want ≤ 1s (not refreshed)", d)
		}
	})
	t.Run("acquire fenced", func(t *testing.T) {
		k := NewKeys("lock:naf", "lock:naf:fence", "tok")
		admin.Set(ctx, k.Fence, 7, 0)
		ok, _, err := AcquireWith(ctx, c, k, AcquireArgs("tok", time.Minute, Waiter{}, wake), past())
		if ok || !errors.Is(err, ErrLate) {
			t.Fatalf("AcquireWith(fenced, past bound) = %v, %v; want false, ErrLate", ok, err)
		}
		if n, _ := admin.Exists(ctx, k.Lock).Result(); n != 0 {
			t.Errorf("lock key after a late fenced acquire exists; want none")
		}
	})
	t.Run("acquire guarded", func(t *testing.T) {
		k := NewKeys("lock:nag", "", "tok")
		args := AcquireArgs("tok", time.Minute, Waiter{}, wake)
		// A guard of 0s: the node grants once up for 1s, unless the bound
		// has passed. The restart guard's argument follows the bound.
		deadline := time.Now().Add(5 * time.Second)
		for {
			ok, _, err := AcquireGuardedWith(ctx, c, k, args, ahead(), 0)
			if ok && err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("AcquireGuardedWith(bound ahead, guard 0) = %v, %v; want true, nil", ok, err)
			}
			time.Sleep(50 * time.Millisecond) // up for 0s: not more than the guard yet
		}
		k2 := NewKeys("lock:nag2", "", "tok")
		if ok, _, err := AcquireGuardedWith(ctx, c, k2, args, past(), 0); ok || !errors.Is(err, ErrLate) {
			t.Fatalf("AcquireGuardedWith(past bound) = %v, %v; want false, ErrLate", ok, err)
		}
		if n, _ := admin.Exists(ctx, k2.Lock).Result(); n != 0 {
			t.Errorf("lock key after a late guarded acquire exists; want none")
		}
	})
	t.Run("extend", func(t *testing.T) {
		k := NewKeys("lock:ne", "", "tok")
		p := PrepareExtend(k, "tok", time.Minute, 0)
		if e, err := p.Extend(ctx, c, past()); e != Refused || !errors.Is(err, ErrLate) {
			t.Fatalf("Extend(absent key, past bound) = %v, %v; want Refused, ErrLate (no heal)", e, err)
		}
		if n, _ := admin.Exists(ctx, k.Lock).Result(); n != 0 {
			t.Fatalf("lock key after a late extend exists; want none")
		}
		admin.Set(ctx, k.Lock, "tok", time.Second)
		if e, err := p.Extend(ctx, c, past()); e != Refused || !errors.Is(err, ErrLate) {
			t.Fatalf("Extend(our key, past bound) = %v, %v; want Refused, ErrLate", e, err)
		}
		if d, _ := admin.PTTL(ctx, k.Lock).Result(); d > time.Second {
			t.Errorf("PTTL after a late extend = %v; want ≤ 1s (not re-armed)", d)
		}
		if e, err := p.Extend(ctx, c, ahead()); e != Rearmed || err != nil {
			t.Fatalf("Extend(our key, bound ahead) = %v, %v; want Rearmed, nil", e, err)
		}
		pipe := c.Pipeline()
		cmd := ExtendCmd(ctx, pipe, k, "tok", time.Minute, 0, past())
		_, _ = pipe.Exec(ctx)
		if e, err := ExtendResult(cmd); e != Refused || !errors.Is(err, ErrLate) {
			t.Errorf("ExtendCmd(past bound) = %v, %v; want Refused, ErrLate", e, err)
		}
		// A late reply is no refusal to the caller either: it reads as the
		// timeout it stands for.
		if !errors.Is(ErrLate, context.DeadlineExceeded) {
			t.Errorf("ErrLate does not match context.DeadlineExceeded")
		}
	})
	// The read-write and multi-resource scripts answer a late request as
	// acquire.lua and extend.lua do: ErrLate, and nothing set.
	t.Run("rw and multi", func(t *testing.T) {
		for _, k := range []Keys{
			NewReadKeys("lock:nar", "tok"),
			NewWriteKeys("lock:naw", "lock:naw:fence", "tok"),
			NewMultiKeys([]string{"lock:nam1", "lock:nam2"}, "tok"),
		} {
			if ok, _, err := AcquireWith(ctx, c, k, AcquireArgs("tok", time.Minute, Waiter{}, wake), past()); ok || !errors.Is(err, ErrLate) {
				t.Errorf("%s: AcquireWith(past bound) = %v, %v; want false, ErrLate", k.Lock, ok, err)
			}
			if e, err := PrepareExtend(k, "tok", time.Minute, 0).Extend(ctx, c, past()); e != Refused || !errors.Is(err, ErrLate) {
				t.Errorf("%s: Extend(past bound) = %v, %v; want Refused, ErrLate (no heal)", k.Lock, e, err)
			}
			if n, _ := admin.Exists(ctx, k.acq...).Result(); n != 0 {
				t.Errorf("%s: %d keys after a late acquire and extend; want none", k.Lock, n)
			}
		}
	})
	t.Run("proclaim", func(t *testing.T) {
		// An election's identity write (package election) is bounded too:
		// one that runs late writes nothing, one whose bound is ahead or
		// absent writes.
		admin.Set(ctx, "lock:np", "tok", time.Minute)
		if ok, err := Proclaim(ctx, c, "lock:np", "lock:np:leader", "term", "tok", "me", *past()); ok || err != nil {
			t.Fatalf("Proclaim(past bound) = %v, %v; want false, nil", ok, err)
		}
		if n, _ := admin.Exists(ctx, "lock:np:leader").Result(); n != 0 {
			t.Fatal("identity key after a late proclaim exists; want none")
		}
		for _, b := range []int64{*ahead(), 0} {
			if ok, err := Proclaim(ctx, c, "lock:np", "lock:np:leader", "term", "tok", "me", b); !ok || err != nil {
				t.Fatalf("Proclaim(bound %d) = %v, %v; want true, nil", b, ok, err)
			}
		}
	})
	t.Run("no bound", func(t *testing.T) {
		k := NewKeys("lock:nn", "", "tok")
		if ok, _, err := AcquireWith(ctx, c, k, AcquireArgs("tok", time.Minute, Waiter{}, wake), nil); !ok || err != nil {
			t.Fatalf("AcquireWith(nil bound) = %v, %v; want true, nil", ok, err)
		}
		var zero int64
		if e, err := PrepareExtend(k, "tok", time.Minute, 0).Extend(context.WithoutCancel(ctx), c, &zero); e != Rearmed || err != nil {
			t.Fatalf("Extend(bound 0) = %v, %v; want Rearmed, nil", e, err)
		}
	})
}

// A refused attempt that does not queue writes nothing, so it reads no
// TIME (issue 32): past its not-after bound it answers 0, a true refusal,
// and only where it could write (free key, our own key, queueing) does the
// bound make it -2.
func TestNotAfter_refusalReadsNoTime(t *testing.T) {
	ctx := t.Context()
	m, c := newNode(t)
	const key = "lock:na"
	m.Set(key, "other")
	k := NewKeys(key, "", "tok")
	past := int64(1) // long past on any clock
	ok, _, err := AcquireWith(ctx, c, k, AcquireArgs("tok", time.Second, Waiter{}, wake), &past)
	if ok || err != nil {
		t.Errorf("late refused attempt, not queueing = %v, %v; want refused (0), no ErrLate", ok, err)
	}
	w := Waiter{Member: Member("c", time.Second, "tok"), Ticket: 1, Lapse: time.Minute, Attempt: 1, Fresh: true}
	if _, _, err := AcquireWith(ctx, c, k, AcquireArgs("tok", time.Second, w, wake), &past); !errors.Is(err, ErrLate) {
		t.Errorf("late queueing attempt = %v; want ErrLate", err)
	}
	if n, _ := m.ZMembers(key + QueueSuffix); len(n) != 0 {
		t.Errorf("queue after a late queueing attempt = %q; want empty", n)
	}
}
