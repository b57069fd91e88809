package redlockprom_test

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

// A Lock call whose ctx was cancelled is counted with outcome "canceled",
// not "no_quorum": the caller's cancellation is no node trouble.
func TestOutcome_canceled(t *testing.T) {
	t.Parallel()
	var nodes []redis.UniversalClient
	for range 3 {
		m := miniredis.RunT(t)
		cl := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { cl.Close() })
		nodes = append(nodes, cl)
	}
	h := redlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	c, err := redlock.New(nodes, redlock.WithHooks(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.Lock(ctx, "job"); err == nil {
		t.Fatal("Lock with a cancelled ctx succeeded")
	}
	m := gather(t, reg)
	// A ctx done before the call sends no round (issue 44 item 3): no
	// acquisition round is observed, and the call is canceled.
	if f := m["redis_lock_acquire_duration_seconds"]; f != nil {
		for _, s := range f.GetMetric() {
			if n := s.GetHistogram().GetSampleCount(); n > 0 {
				t.Errorf("redis_lock_acquire_duration_seconds has %d samples; want none (no round was sent)", n)
			}
		}
	}
	for _, name := range []string{"redis_lock_wait_duration_seconds"} {
		f := m[name]
		if f == nil {
			t.Fatalf("no %s", name)
		}
		var outcomes []string
		for _, s := range f.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == "outcome" && s.GetHistogram().GetSampleCount() > 0 {
					outcomes = append(outcomes, lp.GetValue())
				}
			}
		}
		if len(outcomes) != 1 || outcomes[0] != string(redlock.OutcomeCanceled) {
			t.Errorf("%s outcomes = %q; want [canceled]", name, outcomes)
		}
	}
}
