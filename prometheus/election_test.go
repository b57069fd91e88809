package redlockprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	redlockprom "github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

func TestHooks_Leadership(t *testing.T) {
	var nodes []redis.UniversalClient
	for range 3 {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { c.Close() })
		nodes = append(nodes, c)
	}
	h := redlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	client, err := redlock.New(nodes, redlock.WithHooks(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	e, err := election.New(client, "jobs", election.WithHooks(h))
	if err != nil {
		t.Fatal(err)
	}
	term, err := e.Campaign(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	fams := gather(t, reg)
	if got := fams.find("redis_election_leader", map[string]string{"election": "jobs"}).GetGauge().GetValue(); got != 1 {
		t.Errorf("redis_election_leader while leading = %v; want 1", got)
	}
	if s := fams.find("redis_election_changes_total", map[string]string{"election": "jobs", "event": "lost"}); s == nil || s.GetCounter().GetValue() != 0 {
		t.Errorf("lost changes before any loss = %v; want a series at 0", s)
	}
	if err := term.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A loss, reported as the election would.
	h.Leadership(context.Background(), election.LeadershipInfo{Election: "jobs", Event: election.EventAcquired})
	h.Leadership(context.Background(), election.LeadershipInfo{Election: "jobs", Event: election.EventLost,
		Held: 3 * time.Second, Err: redlock.ErrLockLost})

	fams = gather(t, reg)
	cases := []struct {
		event string
		want  float64
	}{{"acquired", 2}, {"resigned", 1}, {"lost", 1}}
	for _, tc := range cases {
		got := fams.find("redis_election_changes_total", map[string]string{"election": "jobs", "event": tc.event}).GetCounter().GetValue()
		if got != tc.want {
			t.Errorf("redis_election_changes_total{event=%q} = %v; want %v", tc.event, got, tc.want)
		}
	}
	if got := fams.find("redis_election_leader", map[string]string{"election": "jobs"}).GetGauge().GetValue(); got != 0 {
		t.Errorf("redis_election_leader after the terms ended = %v; want 0", got)
	}
	lost := fams.find("redis_election_term_duration_seconds", map[string]string{"election": "jobs", "event": "lost"}).GetHistogram()
	if lost.GetSampleCount() != 1 || lost.GetSampleSum() != 3 {
		t.Errorf("term duration of lost terms: count %d, sum %v; want 1, 3", lost.GetSampleCount(), lost.GetSampleSum())
	}
	if got := fams.find("redis_election_campaign_duration_seconds", map[string]string{"election": "jobs"}).GetHistogram().GetSampleCount(); got != 2 {
		t.Errorf("campaign duration count = %d; want 2", got)
	}
}
