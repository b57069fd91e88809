package redlockprom

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quorumlock/quorumlock/election"
)

var _ election.Hooks = (*Hooks)(nil)

// electionMetrics are the series of election.Hooks: pass the same Hooks to
// election.WithHooks. Their election label is the election's name (few
// distinct values, unlike lock resources).
//
//	redis_election_leader{election}                         gauge      candidates of this process leading now (0 or 1 per election, usually)
//	redis_election_changes_total{election,event}            counter    leadership acquired, lost, resigned
//	redis_election_term_duration_seconds{election,event}    histogram  how long a term lasted, by how it ended (lost, resigned)
//	redis_election_campaign_duration_seconds{election}      histogram  from Campaign to leadership
type electionMetrics struct {
	leader   *prometheus.GaugeVec
	changes  *prometheus.CounterVec
	term     *prometheus.HistogramVec
	campaign *prometheus.HistogramVec
}

func newElectionMetrics(cl prometheus.Labels) *electionMetrics {
	return &electionMetrics{
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "redis_election_leader",
			Help:        "Candidates of this process that lead now, per election.",
			ConstLabels: cl,
		}, []string{"election"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "redis_election_changes_total",
			Help:        "Leadership changes of this process's candidates, by event: acquired, lost, resigned.",
			ConstLabels: cl,
		}, []string{"election", "event"}),
		term: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "redis_election_term_duration_seconds",
			Help:        "How long a term of office lasted, by how it ended: lost or resigned.",
			Buckets:     prometheus.ExponentialBuckets(0.01, 4, 10), // 10ms to 44min
			ConstLabels: cl,
		}, []string{"election", "event"}),
		campaign: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "redis_election_campaign_duration_seconds",
			Help:        "Time from the start of a campaign to leadership.",
			Buckets:     prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms to 262s
			ConstLabels: cl,
		}, []string{"election"}),
	}
}

// start makes the series of the named election at zero (WithElections).
func (m *electionMetrics) start(name string) {
	m.leader.WithLabelValues(name)
	for _, e := range []election.Event{election.EventAcquired, election.EventLost, election.EventResigned} {
		m.changes.WithLabelValues(name, string(e))
	}
}

func (m *electionMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.leader, m.changes, m.term, m.campaign}
}

// Leadership implements election.Hooks: it counts the change, keeps
// redis_election_leader, and observes the campaign or the term's duration.
func (h *Hooks) Leadership(_ context.Context, i election.LeadershipInfo) {
	m := h.elections
	if m.changes.WithLabelValues(i.Election, string(i.Event)).Inc(); i.Event == election.EventAcquired {
		// The other events start at zero, so that the first loss shows in
		// increase().
		m.changes.WithLabelValues(i.Election, string(election.EventLost))
		m.changes.WithLabelValues(i.Election, string(election.EventResigned))
		m.leader.WithLabelValues(i.Election).Inc()
		m.campaign.WithLabelValues(i.Election).Observe(i.Wait.Seconds())
		return
	}
	m.leader.WithLabelValues(i.Election).Dec()
	m.term.WithLabelValues(i.Election, string(i.Event)).Observe(i.Held.Seconds())
}
