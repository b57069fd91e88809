package redlockprom_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

// seriesCount returns the number of series the registry exports.
func seriesCount(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	n := 0
	for _, f := range gather(t, reg) {
		n += len(f.GetMetric())
	}
	return n
}

// TestResourceLabel_bounded locks and releases 10,000 distinct resources,
// and loses some, with the default options: the series stay bounded however
// the names are built (ids after a ":", or names with no ":" at all), while
// WithFullResourceLabel makes one per name, as its doc warns.
func TestResourceLabel_bounded(t *testing.T) {
	t.Parallel()
	const ids = 10_000
	cases := []struct {
		name       string
		opts       []redlockprom.Option
		format     string
		wantMax    int // series of redis_lock_held (and of redis_lock_expired_total)
		wantLabels []string
	}{
		{"default, ids after a colon", nil, "invoice:%d", 1, []string{"invoice"}},
		{"default, kinds and ids", nil, "kind%d:%d", 10, nil},
		{"default, no colon", nil, "job-%d", redlockprom.ResourceLabelLimit + 1, []string{redlockprom.OtherResource}},
		{"custom mapping", []redlockprom.Option{redlockprom.WithResourceLabel(func(r string) string { return r })},
			"job-%d", redlockprom.ResourceLabelLimit + 1, []string{redlockprom.OtherResource}},
		{"full names", []redlockprom.Option{redlockprom.WithFullResourceLabel()}, "invoice:%d", ids, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := redlockprom.New(tc.opts...)
			reg := prometheus.NewRegistry()
			reg.MustRegister(h)
			before := seriesCount(t, reg)
			ctx := context.Background()
			for i := range ids {
				var r string
				if tc.format == "kind%d:%d" {
					r = fmt.Sprintf(tc.format, i%10, i)
				} else {
					r = fmt.Sprintf(tc.format, i)
				}
				h.Acquire(ctx, redlock.AcquireInfo{Resource: r, Outcome: redlock.OutcomeAcquired, Attempts: 1})
				if i%100 == 0 {
					h.Lost(ctx, redlock.LostInfo{Resource: r, Err: redlock.ErrLockLost})
					h.Release(ctx, redlock.ReleaseInfo{Resource: r, WasLost: true})
					continue
				}
				h.Release(ctx, redlock.ReleaseInfo{Resource: r, HeldFor: time.Millisecond})
			}
			m := gather(t, reg)
			for _, name := range []string{"redis_lock_held", "redis_lock_expired_total"} {
				if got := len(m[name].GetMetric()); got > tc.wantMax {
					t.Errorf("%s: %d series after %d resources; want at most %d", name, got, ids, tc.wantMax)
				}
			}
			if tc.wantMax < ids {
				// Everything else is unlabelled or labelled by a fixed set.
				if got := seriesCount(t, reg) - before; got > 2*tc.wantMax+20 {
					t.Errorf("%d new series in all after %d resources; want at most %d", got, ids, 2*tc.wantMax+20)
				}
			}
			var held, expired float64
			for _, s := range m["redis_lock_held"].GetMetric() {
				held += s.GetGauge().GetValue()
			}
			for _, s := range m["redis_lock_expired_total"].GetMetric() {
				expired += s.GetCounter().GetValue()
			}
			if held != 0 || expired != ids/100 {
				t.Errorf("held = %v, expired = %v summed over series; want 0, %d (every lock counted, on one series each way)", held, expired, ids/100)
			}
			for _, v := range tc.wantLabels {
				if m.find("redis_lock_held", labels{"resource": v}) == nil {
					t.Errorf("no redis_lock_held{resource=%q}", v)
				}
			}
		})
	}
}

// TestQuorumHeadroom checks redis_lock_nodes_failing and
// redis_lock_quorum_headroom: absent until a round told the node count,
// down by one for each node that failed within NodeFailureWindow (errors
// that say nothing about the node excluded), back once the window passed.
func TestQuorumHeadroom(t *testing.T) {
	t.Parallel()
	h := redlockprom.New()
	now := time.Unix(1_000_000, 0)
	redlockprom.SetClock(h, func() time.Time { return now })
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	ctx := context.Background()
	headroom := func() float64 { return gather(t, reg).value("redis_lock_quorum_headroom", nil) }
	failing := func() float64 { return gather(t, reg).value("redis_lock_nodes_failing", nil) }

	if got := headroom(); got != -1 {
		t.Errorf("headroom before any round = %v; want absent", got)
	}
	h.Attempt(ctx, redlock.AttemptInfo{Resource: "r", Granted: 3, Quorum: 3, Nodes: 5, Outcome: redlock.OutcomeAcquired})
	if got := headroom(); got != 2 {
		t.Errorf("headroom with 5 nodes, quorum 3 = %v; want 2", got)
	}
	nodeErr := func(node int, kind string, err error) {
		h.NodeError(ctx, redlock.NodeErrorInfo{Resource: "r", Op: "extend", Node: node, Addr: "n" + strconv.Itoa(node), Kind: kind, Err: err})
	}
	nodeErr(0, "canceled", context.Canceled)
	nodeErr(1, "reply", redis.Nil) // stands for any reply error
	nodeErr(2, "reply", errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"))
	h.NodeError(ctx, redlock.NodeErrorInfo{Op: "dial", Node: 3, Addr: "n3", Kind: "reply", Err: errors.New("NOPERM role")})
	if got, want := failing(), 1.0; got != want {
		t.Errorf("failing after canceled, a reply error, WRONGTYPE and a dial NOPERM = %v; want %v (the reply error)", got, want)
	}
	now = now.Add(10 * time.Second)
	nodeErr(4, "timeout", context.DeadlineExceeded)
	nodeErr(4, "connection", errors.New("connection refused")) // one node counts once
	if got := headroom(); got != 0 {
		t.Errorf("headroom with 2 nodes failing = %v; want 0", got)
	}
	now = now.Add(redlockprom.NodeFailureWindow - 5*time.Second) // node 1's failure is older than the window
	if got := headroom(); got != 1 {
		t.Errorf("headroom once node 1's failure is %v old = %v; want 1", redlockprom.NodeFailureWindow+5*time.Second, got)
	}
	now = now.Add(time.Minute)
	if got, want := headroom(), 2.0; got != want || failing() != 0 {
		t.Errorf("headroom, failing after the window = %v, %v; want %v, 0", got, failing(), want)
	}
}

// TestWithElections checks that a named election reports no leader before
// any Leadership event, so the no-leader alert sees it.
func TestWithElections(t *testing.T) {
	t.Parallel()
	h := redlockprom.New(redlockprom.WithElections("scheduler"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	e := labels{"election": "scheduler"}
	if got := gather(t, reg).value("redis_election_leader", e); got != 0 {
		t.Errorf("redis_election_leader{scheduler} before any term = %v; want 0", got)
	}
	h.Leadership(context.Background(), election.LeadershipInfo{Election: "scheduler", Event: election.EventAcquired})
	m := gather(t, reg)
	if got := m.value("redis_election_leader", e); got != 1 {
		t.Errorf("redis_election_leader{scheduler} while leading = %v; want 1", got)
	}
	if got := m.value("redis_election_changes_total", labels{"election": "scheduler", "event": "lost"}); got != 0 {
		t.Errorf("changes{lost} = %v; want 0 (present)", got)
	}
}
