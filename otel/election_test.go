package redlockotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/otel"
	"github.com/quorumlock/quorumlock/redlock"
)

func TestHooks_Leadership(t *testing.T) {
	tel := newTelemetry(t)
	h, err := redlockotel.New(redlockotel.WithMeterProvider(tel.mp), redlockotel.WithTracerProvider(tel.tp))
	if err != nil {
		t.Fatal(err)
	}
	_, nodes := miniNodes(t, 3)
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
	name := redlockotel.KeyElection.String("jobs")
	if got := sum(tel.collect(t), "redlock.election.leader", name); got != 1 {
		t.Errorf("redlock.election.leader while leading = %d; want 1", got)
	}
	if err := term.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.Leadership(context.Background(), election.LeadershipInfo{Election: "jobs", Event: election.EventAcquired})
	h.Leadership(context.Background(), election.LeadershipInfo{Election: "jobs", Event: election.EventLost,
		Held: 3 * time.Second, Err: redlock.ErrLockLost})

	ms := tel.collect(t)
	for _, tc := range []struct {
		event election.Event
		want  int64
	}{{election.EventAcquired, 2}, {election.EventResigned, 1}, {election.EventLost, 1}} {
		if got := sum(ms, "redlock.election.changes", name, redlockotel.KeyElectionEvent.String(string(tc.event))); got != tc.want {
			t.Errorf("redlock.election.changes{%s} = %d; want %d", tc.event, got, tc.want)
		}
	}
	if got := sum(ms, "redlock.election.leader", name); got != 0 {
		t.Errorf("redlock.election.leader after the terms ended = %d; want 0", got)
	}
	if n, total, _ := hist[float64](ms, "redlock.election.term.duration", name, redlockotel.KeyElectionEvent.String("lost")); n != 1 || total != 3 {
		t.Errorf("lost term durations: count %d, sum %v; want 1, 3", n, total)
	}
	if n, _, _ := hist[float64](ms, "redlock.election.campaign.duration", name); n != 2 {
		t.Errorf("campaign durations: count %d; want 2", n)
	}
}
