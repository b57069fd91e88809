package redlockotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/quorumlock/quorumlock/election"
)

var _ election.Hooks = (*Hooks)(nil)

// Attribute keys of the election instruments.
const (
	KeyElection      = attribute.Key("redlock.election")
	KeyElectionEvent = attribute.Key("redlock.election.event")
)

// electionInstruments are the instruments of election.Hooks: pass the same
// Hooks to election.WithHooks. Their redlock.election attribute is the
// election's name (few distinct values, unlike lock resources).
//
//	redlock.election.leader            updowncounter  {leader}  candidates of this process leading now; redlock.election
//	redlock.election.changes           counter        {change}  leadership acquired, lost, resigned; redlock.election, redlock.election.event
//	redlock.election.term.duration     histogram      s         how long a term lasted, by how it ended (lost, resigned)
//	redlock.election.campaign.duration histogram      s         from Campaign to leadership
type electionInstruments struct {
	leader   metric.Int64UpDownCounter
	changes  metric.Int64Counter
	term     metric.Float64Histogram
	campaign metric.Float64Histogram
}

func newElectionInstruments(m metric.Meter) (*electionInstruments, error) {
	var ei electionInstruments
	var err, e error
	ei.leader, e = m.Int64UpDownCounter("redlock.election.leader", metric.WithUnit("{leader}"),
		metric.WithDescription("Candidates of this process that lead now, per election."))
	err = errors.Join(err, e)
	ei.changes, e = m.Int64Counter("redlock.election.changes", metric.WithUnit("{change}"),
		metric.WithDescription("Leadership changes of this process's candidates, by event: acquired, lost, resigned."))
	err = errors.Join(err, e)
	ei.term, e = m.Float64Histogram("redlock.election.term.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a term of office lasted, by how it ended: lost or resigned."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	err = errors.Join(err, e)
	ei.campaign, e = m.Float64Histogram("redlock.election.campaign.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from the start of a campaign to leadership."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	err = errors.Join(err, e)
	return &ei, err
}

// Leadership implements election.Hooks: it counts the change, keeps
// redlock.election.leader, and records the campaign or the term's duration.
func (h *Hooks) Leadership(ctx context.Context, i election.LeadershipInfo) {
	ei := h.elections
	name := KeyElection.String(i.Election)
	ei.changes.Add(ctx, 1, metric.WithAttributes(name, KeyElectionEvent.String(string(i.Event))))
	if i.Event == election.EventAcquired {
		ei.leader.Add(ctx, 1, metric.WithAttributes(name))
		ei.campaign.Record(ctx, i.Wait.Seconds(), metric.WithAttributes(name))
		return
	}
	ei.leader.Add(ctx, -1, metric.WithAttributes(name))
	ei.term.Record(ctx, i.Held.Seconds(), metric.WithAttributes(name, KeyElectionEvent.String(string(i.Event))))
}
