package redlockprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

// gather collects reg into the same shape as a scrape.
func gather(t *testing.T, reg *prometheus.Registry) metrics {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return m
}

// labelNames returns the label names of the first series of family name.
func labelNames(m metrics, name string) []string {
	f := m[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return nil
	}
	var names []string
	for _, lp := range f.GetMetric()[0].GetLabel() {
		names = append(names, lp.GetName())
	}
	return names
}

// replay sends the events of two locks on invoices to h: one released in
// time, one lost and then released.
func replay(h redlock.Hooks) {
	ctx := context.Background()
	for _, r := range []string{"invoice:1", "invoice:2"} {
		h.Acquire(ctx, redlock.AcquireInfo{Resource: r, Outcome: redlock.OutcomeAcquired, Attempts: 1})
	}
	h.Release(ctx, redlock.ReleaseInfo{Resource: "invoice:1", HeldFor: time.Second, Released: 3})
	h.Lost(ctx, redlock.LostInfo{Resource: "invoice:2", HeldFor: 2 * time.Second, Err: redlock.ErrLockLost})
	h.Release(ctx, redlock.ReleaseInfo{Resource: "invoice:2", HeldFor: 2 * time.Second, WasLost: true})
}

func TestResourceLabel(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		opts       []redlockprom.Option
		wantLabels []string          // label names of the resource series
		wantSeries map[string]string // resource label value → "" (only with a label)
	}{
		{"default: prefix", nil, []string{"resource"}, map[string]string{"invoice": ""}},
		{"full", []redlockprom.Option{redlockprom.WithFullResourceLabel()}, []string{"resource"}, map[string]string{"invoice:1": "", "invoice:2": ""}},
		{"custom", []redlockprom.Option{redlockprom.WithResourceLabel(func(string) string { return "all" })},
			[]string{"resource"}, map[string]string{"all": ""}},
		{"none", []redlockprom.Option{redlockprom.WithoutResourceLabel()}, nil, nil},
		{"const labels", []redlockprom.Option{redlockprom.WithoutResourceLabel(), redlockprom.WithConstLabels(prometheus.Labels{"client": "billing"})},
			[]string{"client"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := redlockprom.New(tc.opts...)
			reg := prometheus.NewRegistry()
			reg.MustRegister(h)
			replay(h)
			m := gather(t, reg)
			for _, name := range []string{"redis_lock_expired_total", "redis_lock_held"} {
				if got := labelNames(m, name); !equal(got, tc.wantLabels) {
					t.Errorf("%s labels = %v; want %v", name, got, tc.wantLabels)
				}
				if n := len(m[name].GetMetric()); tc.wantSeries != nil && n != len(tc.wantSeries) {
					t.Errorf("%s has %d series; want %d", name, n, len(tc.wantSeries))
				}
			}
			var expired, held float64
			for _, s := range m["redis_lock_expired_total"].GetMetric() {
				expired += s.GetCounter().GetValue()
				if tc.wantSeries != nil {
					if _, ok := tc.wantSeries[resourceOf(s)]; !ok {
						t.Errorf("unexpected series resource=%q", resourceOf(s))
					}
				}
			}
			for _, s := range m["redis_lock_held"].GetMetric() {
				held += s.GetGauge().GetValue()
			}
			if expired != 1 || held != 0 {
				t.Errorf("expired = %v, held = %v; want 1 (the lost lock, once), 0", expired, held)
			}
		})
	}
}

func resourceOf(s *dto.Metric) string {
	for _, lp := range s.GetLabel() {
		if lp.GetName() == "resource" {
			return lp.GetValue()
		}
	}
	return ""
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestExtend_cancelledRenewal checks that a renewal cut short by Unlock is
// neither a failure nor a quorum margin, while a renewal that lost the lock
// is both.
func TestExtend_cancelledRenewal(t *testing.T) {
	t.Parallel()
	h := redlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	h.Extend(cancelled, redlock.ExtendInfo{Resource: "r", Renewal: true, Confirmed: 1, Quorum: 3, Nodes: 5, Err: redlock.ErrNoQuorum})
	h.Extend(cancelled, redlock.ExtendInfo{Resource: "r", Renewal: true, Confirmed: 0, Quorum: 3, Nodes: 5, Err: redlock.ErrLockLost})
	m := gather(t, reg)
	if got := m.value("redis_lock_renewal_failures_total", labels{"reason": "no_quorum"}); got != 0 {
		t.Errorf("failures{no_quorum} = %v; want 0 (the round was cancelled)", got)
	}
	if got := m.value("redis_lock_renewal_failures_total", labels{"reason": "lost"}); got != 1 {
		t.Errorf("failures{lost} = %v; want 1", got)
	}
	if got := m.value("redis_lock_quorum_margin", labels{"op": "extend"}); got != 1 {
		t.Errorf("extend margins observed %v times; want 1", got)
	}
}
