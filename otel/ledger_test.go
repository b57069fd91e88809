package redlockotel

import (
	"testing"
	"time"
)

// TestLedger replays the orders in which a Client reports one lock's
// events, and checks that each lock moves the expired count and the held
// count once.
func TestLedger(t *testing.T) {
	t.Parallel()
	type step struct {
		at      time.Duration // when the hook runs
		op      string        // "acquire", "lost", "release", "release-lost"
		heldFor time.Duration // for lost and release: since acquisition
	}
	cases := []struct {
		name        string
		steps       []step
		wantExpired int
		wantHeld    []int // exported held count after each step
	}{
		{
			name:     "released in time",
			steps:    []step{{0, "acquire", 0}, {time.Second, "release", time.Second}},
			wantHeld: []int{1, 0},
		},
		{
			name: "lost, then released",
			steps: []step{{0, "acquire", 0}, {time.Second, "lost", time.Second},
				{2 * time.Second, "release-lost", 2 * time.Second}},
			wantExpired: 1,
			wantHeld:    []int{1, 0, 0},
		},
		{
			// Unlock ran after ValidUntil but before the watchdog's
			// deadline: no Lost ever comes.
			name:        "expired, released without a Lost",
			steps:       []step{{0, "acquire", 0}, {time.Second, "release-lost", time.Second}},
			wantExpired: 1,
			wantHeld:    []int{1, 0},
		},
		{
			// The watchdog marked the lock lost, an Unlock on another
			// goroutine reported the release, then the Lost hook ran.
			name: "release reported before its Lost",
			steps: []step{{0, "acquire", 0}, {time.Second, "release-lost", time.Second},
				{time.Second + time.Millisecond, "lost", time.Second + time.Millisecond}},
			wantExpired: 1,
			wantHeld:    []int{1, 0, 0},
		},
		{
			name: "lost reported before its Acquire",
			steps: []step{{time.Millisecond, "lost", time.Millisecond}, {2 * time.Millisecond, "acquire", 0},
				{time.Second, "release-lost", time.Second}},
			wantExpired: 1,
			wantHeld:    []int{0, 0, 0},
		},
		{
			// Close released a lock whose Lock call then failed: never held.
			name:     "release of a lock never acquired",
			steps:    []step{{0, "release", 0}, {time.Second, "acquire", 0}},
			wantHeld: []int{0, 1},
		},
		{
			// Two lost locks of one resource, released in the other order:
			// each release finds its own Lost.
			name: "two lost locks, released out of order",
			steps: []step{
				{0, "acquire", 0}, {time.Second, "lost", time.Second},
				{2 * time.Second, "acquire", 0}, {3 * time.Second, "lost", time.Second},
				{4 * time.Second, "release-lost", 2 * time.Second},
				{5 * time.Second, "release-lost", 5 * time.Second},
			},
			wantExpired: 2,
			wantHeld:    []int{1, 0, 1, 0, 0, 0},
		},
		{
			// A lost lock never released and a later one that expires
			// without a Lost: the later release must not take the earlier
			// Lost for its own.
			name: "expired without a Lost beside an unreleased lost lock",
			steps: []step{
				{0, "acquire", 0}, {time.Second, "lost", time.Second},
				{2 * time.Second, "acquire", 0}, {3 * time.Second, "release-lost", time.Second},
			},
			wantExpired: 2,
			wantHeld:    []int{1, 0, 1, 0},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := time.Now()
			var now time.Time
			l := newLedger()
			l.now = func() time.Time { return now }
			held, expired := 0, 0
			for i, s := range tc.steps {
				now = base.Add(s.at)
				var d int
				var e bool
				switch s.op {
				case "acquire":
					d = l.acquired("r")
				case "lost":
					d, e = l.lost("r", s.heldFor)
				case "release":
					d, e = l.released("r", s.heldFor, false)
				case "release-lost":
					d, e = l.released("r", s.heldFor, true)
				}
				held += d
				if e {
					expired++
				}
				if held != tc.wantHeld[i] {
					t.Errorf("after step %d (%s at %v): held = %d; want %d", i, s.op, s.at, held, tc.wantHeld[i])
				}
			}
			if expired != tc.wantExpired {
				t.Errorf("expired = %d; want %d", expired, tc.wantExpired)
			}
		})
	}
}

// TestLedger_forgets checks that a resource whose locks are all accounted
// for leaves nothing behind, and that the credit of a release counted as
// expired lapses.
func TestLedger_forgets(t *testing.T) {
	t.Parallel()
	base := time.Now()
	now := base
	l := newLedger()
	l.now = func() time.Time { return now }
	l.acquired("a")
	now = base.Add(time.Second)
	l.released("a", time.Second, false)
	l.acquired("b")
	now = base.Add(2 * time.Second)
	l.released("b", time.Second, true) // expired, no Lost: leaves a credit
	if len(l.res) != 1 {
		t.Fatalf("%d resources remembered; want 1 (b's credit)", len(l.res))
	}
	now = base.Add(2*time.Second + creditTTL)
	if _, expired := l.lost("b", creditTTL+time.Second); !expired {
		t.Errorf("a Lost matching the lapsed credit was not counted; it must be")
	}
}
