package chaos

import (
	"testing"
	"time"
)

// The K-holders check on hand-made histories.
func TestCheckPermits(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(id int, res string, start, end int) Hold {
		return Hold{ID: id, Resource: res, Start: at(start), Unlock: at(end), ValidUntil: at(end + 100), ValidAtReturn: true}
	}
	cases := []struct {
		name          string
		holds         []Hold
		overflows     int
		most          int
		wantViolation bool
	}{
		{"K holders at once", []Hold{hold(0, "s:permit:0", 0, 100), hold(1, "s:permit:1", 10, 90), hold(2, "s:permit:0", 100, 200)}, 0, 2, false},
		{"K+1 holders at once", []Hold{hold(0, "s:permit:x0", 0, 100), hold(1, "s:permit:x1", 10, 90), hold(2, "s:permit:x2", 50, 200)}, 1, 3, true},
		{"other semaphores do not count", []Hold{hold(0, "s:permit:0", 0, 100), hold(1, "s:permit:1", 10, 90), hold(2, "t:permit:0", 50, 200)}, 0, 2, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := Check(Snapshot{Start: t0, Holds: tc.holds, Permits: map[string]int{"s": 2, "t": 2}}, CheckOptions{})
			if r.PermitOverflows != tc.overflows || r.MaxPermitHolders != tc.most {
				t.Errorf("PermitOverflows, MaxPermitHolders = %d, %d; want %d, %d", r.PermitOverflows, r.MaxPermitHolders, tc.overflows, tc.most)
			}
			if got := r.Violations() > 0; got != tc.wantViolation {
				t.Errorf("Violations() = %d; want > 0: %v", r.Violations(), tc.wantViolation)
			}
		})
	}
}

func TestSplitCut(t *testing.T) {
	t.Parallel()
	// K+1 = 3 clients, each granted by the nodes it keeps; no node may
	// grant more than K = 2, and each keeps a majority.
	for _, n := range []int{3, 5, 7} {
		q := n/2 + 1
		grants := make([]int, n)
		for j := range semPermits + 1 {
			cut := splitCut(n, q, j)
			if got := n - len(cut); got != q {
				t.Errorf("n=%d client %d keeps %d nodes; want %d", n, j, got, q)
			}
			kept := make([]bool, n)
			for i := range kept {
				kept[i] = true
			}
			for _, i := range cut {
				kept[i] = false
			}
			for i, k := range kept {
				if k {
					grants[i]++
				}
			}
		}
		for i, g := range grants {
			if g > semPermits {
				t.Errorf("n=%d: node %d grants %d holders; want ≤ %d", n, i, g, semPermits)
			}
		}
	}
}
