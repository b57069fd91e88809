package chaos

import (
	"reflect"
	"testing"
	"time"
)

// The checker on hand-made histories: each case is one behaviour it must
// count, or must not.
func TestCheck(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(id, client int, res string, fence int64, start, unlock, validUntil int) Hold {
		h := Hold{ID: id, Client: client, Resource: res, Fence: fence, Start: at(start), ValidUntil: at(validUntil), ValidAtReturn: true}
		if unlock >= 0 {
			h.Unlock, h.Released = at(unlock), at(unlock+10)
		}
		return h
	}
	shared := func(h Hold) Hold { h.Shared = true; return h }
	// seen is a sighting of hold's key on node, read at ms, last written
	// age ms before.
	seen := func(hold, node, ms, age int) Sighting {
		return Sighting{Hold: hold, Node: node, At: at(ms), Age: time.Duration(age) * time.Millisecond}
	}
	write := func(res string, client, h int, fence int64, ms int, ok, zombie bool) Write {
		return Write{Resource: res, Client: client, Hold: h, Fence: fence, At: at(ms), Accepted: ok, Zombie: zombie}
	}
	cases := []struct {
		name string
		s    Snapshot
		want Result // only the fields compared below
	}{
		{
			name: "one hold after another: no violation",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 100, 500),
				hold(1, 1, "r", 2, 101, 200, 600),
			}, Writes: []Write{
				write("r", 0, 0, 1, 50, true, false),
				write("r", 1, 1, 2, 150, true, false),
			}},
			want: Result{Acquisitions: 2, Writes: 2, Accepted: 2},
		},
		{
			name: "holds of different resources may overlap",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 100, 500),
				hold(1, 1, "s", 1, 50, 150, 550),
			}},
			want: Result{Acquisitions: 2},
		},
		{
			name: "read holds share; a write hold with a read hold is an overlap",
			s: Snapshot{Holds: []Hold{
				shared(hold(0, 0, "r", 0, 0, 100, 500)),
				shared(hold(1, 1, "r", 0, 50, 150, 550)),
				hold(2, 2, "r", 3, 140, 300, 700),
				hold(3, 3, "r", 4, 301, 400, 800),
			}},
			want: Result{Acquisitions: 4, Overlaps: 1, MaxOverlap: 10 * time.Millisecond},
		},
		{
			name: "overlap: the second starts before the first's unlock",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 100, 500),
				hold(1, 1, "r", 2, 60, 200, 600),
			}},
			want: Result{Acquisitions: 2, Overlaps: 1, MaxOverlap: 40 * time.Millisecond},
		},
		{
			name: "a hold ends at ValidUntil, however late the unlock",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 900, 500),
				hold(1, 1, "r", 2, 501, 700, 1000),
			}},
			want: Result{Acquisitions: 2, SilentExpiries: 1},
		},
		{
			name: "a hold ends at its loss report",
			s: Snapshot{Holds: []Hold{
				func() Hold { h := hold(0, 0, "r", 1, 0, 900, 500); h.LostAt = at(300); return h }(),
				hold(1, 1, "r", 2, 301, 700, 1000),
			}},
			want: Result{Acquisitions: 2, Lost: 1, LostViaChannel: 1, LostBeforeDeadline: 1, MaxReportAfterValid: -200 * time.Millisecond},
		},
		{
			name: "tokens must increase in the order holds started",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 5, 0, 100, 500),
				hold(1, 1, "r", 5, 101, 200, 600),
				hold(2, 1, "r", 4, 201, 300, 700),
				hold(3, 0, "r", 6, 301, 400, 800),
			}},
			want: Result{Acquisitions: 4, TokenOrderViolations: 2},
		},
		{
			name: "stale write applied, by an unfenced register",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 100, 500),
				hold(1, 1, "r", 2, 101, 200, 600),
			}, Writes: []Write{
				write("r", 1, 1, 2, 150, true, false),
				write("r", 0, 0, 1, 160, true, true),
			}},
			want: Result{Acquisitions: 2, Writes: 2, Accepted: 2, StaleAccepted: 1, OutsideHold: 1, OutsideAccepted: 1,
				OutsideAcceptedAfterTakes: 1, Zombie: 1},
		},
		{
			name: "stale write refused, by a fenced register",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 100, 500),
				hold(1, 1, "r", 2, 101, 200, 600),
			}, Writes: []Write{
				write("r", 1, 1, 2, 150, true, false),
				write("r", 0, 0, 1, 160, false, true),
			}},
			want: Result{Acquisitions: 2, Writes: 2, Accepted: 1, Refused: 1, StaleRefused: 1, OutsideHold: 1, Zombie: 1, ZombieRefused: 1},
		},
		{
			name: "a write after the hold, before anyone took over, is unopposed",
			s: Snapshot{Holds: []Hold{
				hold(0, 0, "r", 1, 0, 100, 500),
			}, Writes: []Write{
				write("r", 0, 0, 1, 120, true, false),
			}},
			want: Result{Acquisitions: 1, Writes: 1, Accepted: 1, OutsideHold: 1, OutsideAccepted: 1, OutsideAcceptedUnopposed: 1},
		},
		{
			name: "a late loss report",
			s: Snapshot{Holds: []Hold{
				func() Hold { h := hold(0, 0, "r", 1, 0, 900, 500); h.OnLostAt = at(800); return h }(),
			}},
			want: Result{Acquisitions: 1, Lost: 1, LostViaOnLost: 1, LateReports: 1, MaxReportAfterValid: 300 * time.Millisecond,
				ExpiryReportP50: 300 * time.Millisecond, ExpiryReportP99: 300 * time.Millisecond},
		},
		{
			name: "majority loss: report against validity left",
			s: Snapshot{Holds: []Hold{
				func() Hold { h := hold(0, 0, "r", 1, 0, 700, 500); h.LostAt = at(501); return h }(),
				func() Hold { h := hold(1, 1, "s", 1, 0, 700, 450); h.LostAt = at(452); return h }(),
				hold(2, 2, "t", 1, 0, 100, 450), // unlocked before the event
			}, Majority: []MajorityLoss{{Kind: KindMajorityPause, At: at(200)}}},
			want: Result{Acquisitions: 3, Lost: 2, LostViaChannel: 2, MaxReportAfterValid: 2 * time.Millisecond,
				ExpiryReportP50: 2 * time.Millisecond, ExpiryReportP99: 2 * time.Millisecond,
				MajorityEvents: 1, MajorityHolds: 2, MajorityReported: 2, MaxDetect: 301 * time.Millisecond,
				MaxValidityLeft: 300 * time.Millisecond, MaxDetectOverLeft: 2 * time.Millisecond},
		},
	}
	// The key-reappearance cases: one hold, released (Unlock returned) at
	// 110ms, seen after that on node 1 or 2; the settle is 20ms (so writes
	// up to 130ms race the release), Persist 100ms.
	released := []Hold{hold(0, 0, "r", 1, 0, 100, 500)}
	cases = append(cases, []struct {
		name string
		s    Snapshot
		want Result
	}{
		{
			name: "a key written before the release returned was left by a release not yet landed",
			s:    Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 200, 150), seen(0, 1, 400, 350)}},
			want: Result{Acquisitions: 1, ReleasedKeysLeft: 1},
		},
		{
			name: "a key written within the settle after the release counts as left",
			s:    Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 300, 175)}},
			want: Result{Acquisitions: 1, ReleasedKeysLeft: 1},
		},
		{
			name: "a key written after the release, never seen old, raced a release in flight",
			s:    Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 200, 50), seen(0, 1, 220, 70)}},
			want: Result{Acquisitions: 1, ReleasedKeysRaced: 1, MaxRacedAge: 70 * time.Millisecond},
		},
		{
			name: "a key written after the release and seen old reappeared, once per node",
			s: Snapshot{Holds: released, Seen: []Sighting{
				seen(0, 1, 200, 50), seen(0, 1, 300, 150), seen(0, 1, 400, 250),
				seen(0, 2, 150, 100), // left there
			}},
			want: Result{Acquisitions: 1, ReleasedKeysReappeared: 1, MaxReappearedAge: 250 * time.Millisecond, ReleasedKeysLeft: 1},
		},
		{
			name: "a key that reappeared on a node paused when the release returned",
			s: Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 400, 250)},
				Faults: []Fault{{Kind: KindPause, Nodes: []int{1}, Client: -1, Start: at(50), End: at(140)}}},
			want: Result{Acquisitions: 1, ReleasedKeysReappeared: 1, MaxReappearedAge: 250 * time.Millisecond, ReappearedAfterNodeFault: 1},
		},
		{
			name: "a key seen while the releasing client is paused (its retries wait at its gate) raced the release",
			s: Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 400, 250)},
				Faults: []Fault{{Kind: KindClientPause, Client: 0, Start: at(150), End: at(450)}}},
			want: Result{Acquisitions: 1, ReleasedKeysRaced: 1, MaxRacedAge: 250 * time.Millisecond},
		},
		{
			name: "another client's pause is no excuse",
			s: Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 400, 250)},
				Faults: []Fault{{Kind: KindClientPause, Client: 1, Start: at(150), End: at(450)}}},
			want: Result{Acquisitions: 1, ReleasedKeysReappeared: 1, MaxReappearedAge: 250 * time.Millisecond},
		},
		{
			name: "a sighting before the release returned is not one",
			s:    Snapshot{Holds: released, Seen: []Sighting{seen(0, 1, 105, 0)}},
			want: Result{Acquisitions: 1},
		},
		{
			name: "a lock returned not valid",
			s: Snapshot{Holds: []Hold{
				func() Hold {
					h := hold(0, 0, "r", 1, 0, 100, 500)
					h.ValidAtReturn, h.ValidLeft = false, -time.Millisecond
					return h
				}(),
			}},
			want: Result{Acquisitions: 1, InvalidReturns: 1, MinValidLeft: -time.Millisecond},
		},
	}...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.s.Start = t0
			got := Check(tc.s, CheckOptions{})
			// Compare the counts and durations; maps and examples aside.
			got.FailedLocks, got.Faults, got.Examples = nil, nil, nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Check() = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// The negative and safe outcomes decide Pass the right way round.
func TestOutcomePass(t *testing.T) {
	t.Parallel()
	cases := []struct {
		safe       bool
		violations int
		harness    []string
		want       bool
	}{
		{true, 0, nil, true},
		{true, 1, nil, false},
		{false, 0, nil, false},
		{false, 2, nil, true},
		{true, 0, []string{"node 1 did not restart"}, false},
	}
	for _, tc := range cases {
		o := Outcome{Safe: tc.safe, HarnessErrors: tc.harness, Result: Result{Overlaps: tc.violations}}
		if got := o.Pass(); got != tc.want {
			t.Errorf("Outcome{Safe: %v, violations %d, harness %v}.Pass() = %v; want %v", tc.safe, tc.violations, tc.harness, got, tc.want)
		}
		// The new checks count as violations the same way.
		o.Result = Result{ReleasedKeysReappeared: tc.violations / 2, InvalidReturns: tc.violations - tc.violations/2}
		if got := o.Pass(); got != tc.want {
			t.Errorf("Outcome{Safe: %v, violations %d, harness %v}.Pass() = %v; want %v", tc.safe, tc.violations, tc.harness, got, tc.want)
		}
	}
}
