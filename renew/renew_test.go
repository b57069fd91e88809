package renew

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/cenkalti/backoff/v4"
)

// fake is a lock with a TTL whose Renew behaves as told.
type fake struct {
	ttl time.Duration

	mu     sync.Mutex
	until  time.Time
	renews int
	lost   []error
	lostAt time.Time
	// renew decides each round: it returns the delay before answering and
	// the error (nil = success).
	renew func(n int) (time.Duration, error)
}

func newFake(ttl time.Duration, renew func(n int) (time.Duration, error)) *fake {
	return &fake{ttl: ttl, until: time.Now().Add(ttl), renew: renew}
}

func (f *fake) Renew(ctx context.Context, due time.Time) error {
	start := time.Now()
	f.mu.Lock()
	f.renews++
	n := f.renews
	f.mu.Unlock()
	d, err := f.renew(n)
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	if u := start.Add(f.ttl); u.After(f.until) {
		f.until = u
	}
	f.mu.Unlock()
	return nil
}

func (f *fake) ValidUntil() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.until
}

func (f *fake) Lose(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = append(f.lost, err)
	f.lostAt = time.Now()
}

func (f *fake) state() (renews int, lost []error, lostAt time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews, append([]error(nil), f.lost...), f.lostAt
}

var errTransient = errors.New("no quorum")

func ok(int) (time.Duration, error) { return time.Millisecond, nil }

func TestScheduler_renewsEveryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		f := newFake(300*time.Millisecond, ok)
		h, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3*time.Second + 50*time.Millisecond)
		renews, lost, _ := f.state()
		if renews != 30 || len(lost) != 0 {
			t.Errorf("after 3.05s: %d renewals, lost %v; want 30 renewals, never lost", renews, lost)
		}
		h.Stop()
		h.Stop() // idempotent
		time.Sleep(time.Second)
		if r, lost, _ := f.state(); r != renews || len(lost) != 0 {
			t.Errorf("after Stop: %d renewals, lost %v; want %d, never lost", r, lost, renews)
		}
	})
}

func TestScheduler_permanentErrorLosesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		notOurs := errors.New("majority: not ours")
		f := newFake(300*time.Millisecond, func(n int) (time.Duration, error) {
			if n == 2 {
				return time.Millisecond, backoff.Permanent(notOurs)
			}
			return time.Millisecond, nil
		})
		start := time.Now()
		if _, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		_, lost, at := f.state()
		if len(lost) != 1 || !errors.Is(lost[0], notOurs) || at.Sub(start) != 201*time.Millisecond {
			t.Errorf("lost %v at %v; want once, with the renewal's error, at 201ms", lost, at.Sub(start))
		}
	})
}

func TestScheduler_retriesWhileValid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		// Rounds 2..5 fail; the lease (TTL 300ms) must survive thanks to
		// quick retries well inside the remaining validity.
		f := newFake(300*time.Millisecond, func(n int) (time.Duration, error) {
			if n >= 2 && n <= 5 {
				return time.Millisecond, errTransient
			}
			return time.Millisecond, nil
		})
		if _, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		renews, lost, _ := f.state()
		if len(lost) != 0 || renews < 20 {
			t.Errorf("%d renewals, lost %v; want ≥ 20 renewals and no loss", renews, lost)
		}
	})
}

func TestScheduler_lostAtDeadlineWhenRenewalsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		f := newFake(300*time.Millisecond, func(n int) (time.Duration, error) {
			if n >= 2 {
				return time.Millisecond, errTransient
			}
			return time.Millisecond, nil
		})
		start := time.Now()
		if _, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		renews, lost, at := f.state()
		// Last success started at 100ms, so validity ends at 400ms.
		if len(lost) != 1 || !errors.Is(lost[0], ErrExpired) || !errors.Is(lost[0], errTransient) || at.Sub(start) != 400*time.Millisecond {
			t.Errorf("lost %v at %v; want once with ErrExpired and the last error, at 400ms", lost, at.Sub(start))
		}
		if renews < 4 {
			t.Errorf("%d renewal attempts; want quick retries (≥ 4) before the deadline", renews)
		}
	})
}

func TestScheduler_hangingRenewalStillLosesAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		f := newFake(300*time.Millisecond, func(n int) (time.Duration, error) {
			if n >= 2 {
				return time.Hour, nil // never answers in time
			}
			return time.Millisecond, nil
		})
		start := time.Now()
		if _, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		_, lost, at := f.state()
		if len(lost) != 1 || at.Sub(start) != 400*time.Millisecond {
			t.Errorf("lost %v at %v; want once at 400ms although the renewal hangs", lost, at.Sub(start))
		}
	})
}

func TestScheduler_fixedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		f := newFake(300*time.Millisecond, ok)
		start := time.Now()
		if _, err := s.Add(f, Options{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		renews, lost, at := f.state()
		if renews != 0 || len(lost) != 1 || at.Sub(start) != 300*time.Millisecond {
			t.Errorf("fixed lease: %d renewals, lost %v at %v; want 0 renewals, lost once at 300ms", renews, lost, at.Sub(start))
		}
	})
}

func TestScheduler_deadlineFollowsManualExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		f := newFake(300*time.Millisecond, ok)
		start := time.Now()
		if _, err := s.Add(f, Options{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if err := f.Renew(t.Context(), time.Now()); err != nil { // what Lock.Extend does
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		_, lost, at := f.state()
		if len(lost) != 1 || at.Sub(start) != 500*time.Millisecond {
			t.Errorf("lost %v at %v; want once at 500ms (200ms + TTL)", lost, at.Sub(start))
		}
	})
}

func TestHandle_StopWaitsForRenewalInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		var returned bool
		var mu sync.Mutex
		f := newFake(time.Second, func(int) (time.Duration, error) { return time.Hour, nil })
		f2 := &wrap{fake: f, after: func() { mu.Lock(); returned = true; mu.Unlock() }}
		h, err := s.Add(f2, Options{AutoRenew: true, Interval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond) // the renewal is in flight, hanging
		h.Stop()
		mu.Lock()
		got := returned
		mu.Unlock()
		if !got {
			t.Errorf("Stop returned while the renewal was still running")
		}
		time.Sleep(2 * time.Second)
		if _, lost, _ := f.state(); len(lost) != 0 {
			t.Errorf("lost %v after Stop; want no loss report", lost)
		}
	})
}

// ctxKeeper records the ctx of each renewal, and returns at once.
type ctxKeeper struct {
	*fake
	mu   sync.Mutex
	ctxs []context.Context
}

func (k *ctxKeeper) Renew(ctx context.Context, due time.Time) error {
	k.mu.Lock()
	k.ctxs = append(k.ctxs, ctx)
	k.mu.Unlock()
	return k.fake.Renew(ctx, due)
}

func (k *ctxKeeper) ctx(i int) context.Context {
	k.mu.Lock()
	defer k.mu.Unlock()
	if i >= len(k.ctxs) {
		return nil
	}
	return k.ctxs[i]
}

// A renewal returns at the quorum's early decision while its requests to the
// slower nodes (the heal of a restarted node, say) go on under its ctx: the
// scheduler must not cancel that ctx when Renew returns, only when the next
// renewal starts, or on Stop.
func TestScheduler_renewalCtxOutlivesReturn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		k := &ctxKeeper{fake: newFake(time.Second, ok)}
		h, err := s.Add(k, Options{AutoRenew: true, Interval: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(350 * time.Millisecond) // the first renewal returned after 1ms
		synctest.Wait()
		first := k.ctx(0)
		if first == nil {
			t.Fatal("no renewal after one interval")
		}
		if err := first.Err(); err != nil {
			t.Errorf("renewal ctx after Renew returned: %v; want it live for the requests still in flight", err)
		}
		time.Sleep(300 * time.Millisecond) // the second renewal starts
		synctest.Wait()
		if err := first.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("first renewal's ctx after the next renewal = %v; want context.Canceled", err)
		}
		second := k.ctx(1)
		if second == nil {
			t.Fatal("no second renewal")
		}
		h.Stop()
		if err := second.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("renewal ctx after Stop = %v; want context.Canceled", err)
		}
	})
}

type wrap struct {
	*fake
	after func()
}

func (w *wrap) Renew(ctx context.Context, due time.Time) error {
	err := w.fake.Renew(ctx, due)
	w.after()
	return err
}

func TestScheduler_manyLocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		defer s.Close()
		var fakes []*fake
		for i := range 200 {
			ttl := time.Duration(300+i) * time.Millisecond
			f := newFake(ttl, ok)
			fakes = append(fakes, f)
			if _, err := s.Add(f, Options{AutoRenew: true, Interval: ttl / 3}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Second)
		for i, f := range fakes {
			if renews, lost, _ := f.state(); len(lost) != 0 || renews < 10 {
				t.Errorf("lock %d: %d renewals, lost %v; want ≥ 10 and no loss", i, renews, lost)
			}
		}
	})
}

func TestScheduler_closeCancelsAndRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		f := newFake(time.Second, func(int) (time.Duration, error) { return time.Hour, nil })
		if _, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
		s.Close() // must not wait an hour: the renewal is cancelled
		s.Close()
		if _, err := s.Add(f, Options{}); !errors.Is(err, ErrClosed) {
			t.Errorf("Add after Close = %v; want ErrClosed", err)
		}
		if _, lost, _ := f.state(); len(lost) != 0 {
			t.Errorf("lost %v; Close must not report losses", lost)
		}
	})
}

func TestRetryBackOff(t *testing.T) {
	cases := []struct {
		interval, first, max time.Duration
	}{
		{10 * time.Second, 100 * time.Millisecond, 5 * time.Second},
		{200 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond},
		{30 * time.Millisecond, 10 * time.Millisecond, 15 * time.Millisecond},
		{10 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond},
	}
	for _, tc := range cases {
		b := retryBackOff(tc.interval)
		if b.InitialInterval != tc.first || b.MaxInterval != tc.max {
			t.Errorf("retryBackOff(%v) = first %v max %v; want %v, %v", tc.interval, b.InitialInterval, b.MaxInterval, tc.first, tc.max)
		}
		for range 50 {
			if d := b.NextBackOff(); d <= 0 || d > tc.max*3/2 {
				t.Errorf("retryBackOff(%v).NextBackOff() = %v; want in (0, %v]", tc.interval, d, tc.max*3/2)
			}
		}
	}
}

// batchRecorder renews every target of a batch by calling its Renew, and
// records the batch sizes.
type batchRecorder struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchRecorder) RenewBatch(ctx context.Context, ts []Target, dues []time.Time) []error {
	b.mu.Lock()
	b.sizes = append(b.sizes, len(ts))
	b.mu.Unlock()
	errs := make([]error, len(ts))
	for i, t := range ts {
		errs[i] = t.Renew(ctx, dues[i])
	}
	return errs
}

func TestScheduler_batches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &batchRecorder{}
		s := NewBatched(rec, Batching{Max: 64, Window: 10 * time.Millisecond})
		defer s.Close()
		var fakes []*fake
		// 200 locks added within 5ms: each tick renews them in batches of
		// at most 64.
		for i := range 200 {
			f := newFake(900*time.Millisecond, func(int) (time.Duration, error) { return 0, nil })
			fakes = append(fakes, f)
			if _, err := s.Add(f, Options{AutoRenew: true, Interval: 300 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			if i%40 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(3 * time.Second)
		for i, f := range fakes {
			if renews, lost, _ := f.state(); len(lost) != 0 || renews < 9 {
				t.Errorf("lock %d: %d renewals, lost %v; want ≥ 9 and no loss", i, renews, lost)
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		total := 0
		for _, n := range rec.sizes {
			if n > 64 {
				t.Errorf("batch of %d; want ≤ 64", n)
			}
			total += n
		}
		// 200 locks × 10 rounds in batches of ≤ 64: 4 batches a round.
		if len(rec.sizes) > 4*11 || total < 200*9 {
			t.Errorf("%d batches for %d renewals; want ≤ 44 (batched), ≥ 1800 renewals", len(rec.sizes), total)
		}
	})
}

func TestScheduler_batchLossSemantics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewBatched(&batchRecorder{}, Batching{Max: 16, Window: 5 * time.Millisecond})
		defer s.Close()
		notOurs := errors.New("majority: not ours")
		healthy := newFake(300*time.Millisecond, ok)
		taken := newFake(300*time.Millisecond, func(n int) (time.Duration, error) {
			if n == 2 {
				return 0, backoff.Permanent(notOurs)
			}
			return 0, nil
		})
		failing := newFake(300*time.Millisecond, func(n int) (time.Duration, error) {
			if n >= 2 {
				return 0, errTransient
			}
			return 0, nil
		})
		start := time.Now()
		for _, f := range []*fake{healthy, taken, failing} {
			if _, err := s.Add(f, Options{AutoRenew: true, Interval: 100 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Second)
		if _, lost, _ := healthy.state(); len(lost) != 0 {
			t.Errorf("healthy lock lost: %v", lost)
		}
		if _, lost, at := taken.state(); len(lost) != 1 || !errors.Is(lost[0], notOurs) || at.Sub(start) > 210*time.Millisecond {
			t.Errorf("taken lock: lost %v at %v; want once, with the renewal's error, at the second renewal", lost, at.Sub(start))
		}
		// The last success started at ~100ms (after the healthy lock's 1ms in the batch): lost at its deadline.
		if _, lost, at := failing.state(); len(lost) != 1 || !errors.Is(lost[0], ErrExpired) || at.Sub(start) > 410*time.Millisecond {
			t.Errorf("failing lock: lost %v at %v; want once with ErrExpired by 400ms", lost, at.Sub(start))
		}
	})
}

// lease is a fixed lease that only its deadline ends.
type lease struct{ until time.Time }

func (l *lease) Renew(context.Context, time.Time) error { return nil }
func (l *lease) ValidUntil() time.Time                  { return l.until }
func (l *lease) Lose(error)                             {}

// TestHandle_StopLetsGo: after Stop, the scheduler keeps no reference to the
// lock, whether the loop had taken its handle into the heap or not, long
// before the lock's deadline (issue 22, item 4: handles stayed in the heap
// until their next event, an hour away here).
func TestHandle_StopLetsGo(t *testing.T) {
	s := New()
	defer s.Close()
	const n = 200
	ptrs := make([]weak.Pointer[lease], 0, n)
	func() {
		hs := make([]*Handle, 0, n)
		for i := range n {
			// Every other lease ends earlier than all before it, so that its
			// Add wakes the loop, which takes it into the heap; the others
			// wait in the added list.
			d := time.Hour + time.Duration(i)*time.Millisecond
			if i%2 == 1 {
				d = time.Hour - time.Duration(i)*time.Millisecond
			}
			l := &lease{until: time.Now().Add(d)}
			h, err := s.Add(l, Options{})
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
			ptrs = append(ptrs, weak.Make(l))
			if i%2 == 1 {
				time.Sleep(100 * time.Microsecond) // let the loop take some into its heap
			}
		}
		for _, h := range hs {
			h.Stop()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		live := 0
		for _, p := range ptrs {
			if p.Value() != nil {
				live++
			}
		}
		if live == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d stopped leases still referenced 10s after Stop; want 0", live, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
