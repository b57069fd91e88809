package quorum

import (
	"testing"
	"time"
)

func TestSize(t *testing.T) {
	t.Parallel()
	cases := []struct{ n, want int }{
		{0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 3}, {5, 3}, {6, 4}, {7, 4},
	}
	for _, tc := range cases {
		if got := Size(tc.n); got != tc.want {
			t.Errorf("Size(%d) = %d; want %d", tc.n, got, tc.want)
		}
	}
}

func TestValidity(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		ttl, elapsed time.Duration
		drift        float64
		want         time.Duration
	}{
		{"spec example", 10 * time.Second, 0, 0.01, 10*time.Second - 100*time.Millisecond - 2*time.Millisecond},
		{"elapsed subtracted", 30 * time.Second, 5 * time.Millisecond, 0.01, 30*time.Second - 5*time.Millisecond - 302*time.Millisecond},
		{"zero drift keeps 2ms", time.Second, 0, 0, time.Second - 2*time.Millisecond},
		{"used up", 100 * time.Millisecond, 97 * time.Millisecond, 0.01, 0},
		{"slow round leaves nothing", 100 * time.Millisecond, 98 * time.Millisecond, 0.01, -time.Millisecond},
		{"one millisecond left", 100 * time.Millisecond, 97 * time.Millisecond, 0.0, time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Validity(tc.ttl, tc.elapsed, tc.drift); got != tc.want {
				t.Errorf("Validity(%v, %v, %v) = %v; want %v", tc.ttl, tc.elapsed, tc.drift, got, tc.want)
			}
		})
	}
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ttl, drift := 3*time.Second, 0.01
	for _, elapsed := range []time.Duration{0, time.Millisecond, 250 * time.Millisecond} {
		decided := start.Add(elapsed)
		got := Deadline(start, ttl, drift)
		want := decided.Add(Validity(ttl, elapsed, drift))
		if !got.Equal(want) {
			t.Errorf("Deadline after %v = %v; want decision + validity = %v", elapsed, got, want)
		}
	}
}

// TestGranted: a round's tally grants a lease exactly when it is a
// majority (Tally.Quorum) and Validity is positive, until Deadline.
func TestGranted(t *testing.T) {
	t.Parallel()
	r := &Round[int]{start: time.Now()}
	ttl, drift := 100*time.Millisecond, 0.0
	cases := []struct {
		name    string
		votes   []Vote
		elapsed time.Duration
		want    bool
	}{
		{"majority, time left", []Vote{Yes, Yes, No}, 10 * time.Millisecond, true},
		{"minority", []Vote{Yes, No, No}, 10 * time.Millisecond, false},
		{"majority, no time left", []Vote{Yes, Yes, Yes}, 98 * time.Millisecond, false},
		{"majority, one ms left", []Vote{Yes, Yes, Failed}, 97 * time.Millisecond, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tl := Counted(tc.votes, make([]error, len(tc.votes)))
			tl.Elapsed = tc.elapsed
			until, ok := r.Granted(tl, ttl, drift)
			want := tl.Quorum() && Validity(ttl, tc.elapsed, drift) > 0
			if ok != tc.want || ok != want {
				t.Errorf("Granted = %v; want %v (Quorum && Validity > 0 = %v)", ok, tc.want, want)
			}
			if d := Deadline(r.start, ttl, drift); !until.Equal(d) {
				t.Errorf("Granted until = %v; want Deadline %v", until, d)
			}
		})
	}
}
