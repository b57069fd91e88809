// Package redlockprom exports what the locks of a [redlock.Client] do as
// Prometheus metrics. It is a module of its own, so that the core module
// does not depend on the Prometheus client.
//
// [New] returns [Hooks], which are both the client's hooks and a
// [prometheus.Collector]:
//
//	h := redlockprom.New()
//	prometheus.MustRegister(h)
//	c, err := redlock.New(nodes, redlock.WithHooks(h))
//
// The series (no namespace; use [WithConstLabels] to tell clients apart):
//
//	redis_lock_expired_total{resource}               counter    locks lost or expired before their holder released them
//	redis_lock_expired_all_total                     counter    the same, all resources together; 0 from New on
//	redis_lock_held{resource}                        gauge      locks held now
//	redis_lock_acquire_duration_seconds{outcome}     histogram  one acquisition round on the nodes
//	redis_lock_wait_duration_seconds{outcome}        histogram  a whole Lock or TryLock call, retries included
//	redis_lock_hold_duration_seconds                 histogram  from acquisition to release
//	redis_lock_renewal_lag_seconds                   histogram  from when a renewal was due to its confirmation
//	redis_lock_renewal_failures_total{reason}        counter    failed extension rounds: lost, no_quorum, error
//	redis_lock_quorum_margin{op}                     histogram  nodes that neither failed nor refused a round by its decision, minus the quorum (AttemptInfo.Margin, ExtendInfo.Margin)
//	redis_lock_node_errors_total{node,addr,op,kind}  counter    failed requests to one node
//	redis_lock_nodes_failing                         gauge      nodes with a failed request in the last minute (see NodeFailureWindow)
//	redis_lock_quorum_headroom                       gauge      nodes − quorum − nodes failing: 0 means one more failing node is an outage
//
// It implements election.Hooks as well: pass the same Hooks to
// election.WithHooks for the leadership series (see election.go):
// redis_election_leader, redis_election_changes_total,
// redis_election_term_duration_seconds and
// redis_election_campaign_duration_seconds, labelled by election name.
//
// Each lock counts once in redis_lock_expired_total (and in
// redis_lock_expired_all_total) and leaves redis_lock_held once, though a
// lost lock is reported both by Lost and by its later release (redlock
// reports Lost exactly once, before the release).
//
// A resource's redis_lock_expired_total series is created at 0 when the
// resource label value is first locked, so increase() sees its first
// loss unless the lock was both taken and lost between two scrapes: then
// the series first appears at 1, and increase() sees no growth.
// redis_lock_expired_all_total has no resource label and exists at 0 from
// New on, so that loss shows in its increase(); the shipped
// RedisLockExpiredBeforeRelease alert uses both.
//
// The resource label is bounded by default: the part of the resource name
// before the first ":" ("invoice:1234" → "invoice"), and at most
// [ResourceLabelLimit] distinct values per Hooks (later ones are counted
// under [OtherResource]), so names that embed an id do not make one series
// per id. Choose another mapping with [WithResourceLabel], drop the label
// with [WithoutResourceLabel], or opt in to full names with
// [WithFullResourceLabel].
//
// Alerting rules over these series ship with the package ([Rules],
// [RenderRules]; rules/quorumlock.yml), and so does a Grafana dashboard
// ([Dashboard]; dashboards/quorumlock.json).
package redlockprom

import (
	"context"
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quorumlock/quorumlock/redlock"
)

// Option configures New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	resource    func(string) string // nil: the resource label is dropped
	limit       int                 // distinct resource label values at most; 0: no bound
	constLabels prometheus.Labels
	elections   []string
}

// WithResourceLabel sets the value of the resource label of a lock on
// resource: f(resource). f should return few distinct values, since each
// makes its own series, and must be safe for concurrent use. The first
// [ResourceLabelLimit] distinct values keep their own series; later ones
// are counted under [OtherResource]. The default is [ResourcePrefix](":"):
// "invoice:1234" → "invoice". A nil f drops the label, as
// [WithoutResourceLabel] does.
func WithResourceLabel(f func(resource string) string) Option {
	return optionFunc(func(c *config) { c.resource, c.limit = f, ResourceLabelLimit })
}

// WithFullResourceLabel makes the resource label the full resource name,
// with no bound on its distinct values.
//
// Warning: every distinct resource name then makes its own series of
// redis_lock_expired_total and redis_lock_held, kept for the life of the
// process. Names that embed an id ("invoice:1234", "user:42") grow the
// series without bound: memory in this process, and in the Prometheus
// server that scrapes it, until it falls over. Use it only when resource
// names come from a small fixed set.
func WithFullResourceLabel() Option {
	return optionFunc(func(c *config) { c.resource, c.limit = func(r string) string { return r }, 0 })
}

// WithoutResourceLabel drops the resource label: redis_lock_expired_total
// and redis_lock_held become one series each.
func WithoutResourceLabel() Option {
	return optionFunc(func(c *config) { c.resource = nil })
}

// WithElections starts redis_election_leader of each named election at 0
// and its redis_election_changes_total at 0, so that a process whose
// candidate never led still reports the election (the shipped
// RedisElectionNoLeader alert then sees an election nobody ever won).
// Without it, an election's series appear when this process first leads
// it. None by default.
func WithElections(names ...string) Option {
	return optionFunc(func(c *config) { c.elections = append(c.elections, names...) })
}

// WithConstLabels adds labels with fixed values to every series, e.g. to
// tell two Clients in one process apart. None by default.
func WithConstLabels(l prometheus.Labels) Option {
	return optionFunc(func(c *config) { c.constLabels = l })
}

// Hooks turns the events of a redlock.Client into Prometheus metrics. It
// implements [redlock.Hooks] and [prometheus.Collector]: pass it to
// [redlock.WithHooks] and register it. One Hooks may serve several Clients.
// It is safe for concurrent use; every method returns without blocking on
// I/O.
type Hooks struct {
	redlock.NoHooks // methods added to redlock.Hooks later do nothing here

	resource *labeler // nil: no resource label

	expired  *prometheus.CounterVec
	allLost  prometheus.Counter // expired without the resource label, from 0
	held     *prometheus.GaugeVec
	acquire  *prometheus.HistogramVec
	wait     *prometheus.HistogramVec
	hold     prometheus.Histogram
	lag      prometheus.Histogram
	failures *prometheus.CounterVec
	margin   *prometheus.HistogramVec
	nodeErrs *prometheus.CounterVec
	nodes    *nodeHealth

	elections *electionMetrics // election.Hooks (election.go)
}

var (
	_ redlock.Hooks        = (*Hooks)(nil)
	_ prometheus.Collector = (*Hooks)(nil)
)

// Failure reasons of redis_lock_renewal_failures_total.
const (
	reasonLost     = "lost"      // the round ended with the lock lost: a majority said not ours, or it ended at or after ValidUntil
	reasonNoQuorum = "no_quorum" // too few nodes confirmed; retried while validity remains
	reasonError    = "error"     // anything else
)

// New returns Hooks with their series not yet registered.
func New(opts ...Option) *Hooks {
	cfg := config{resource: ResourcePrefix(":"), limit: ResourceLabelLimit}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	var resource []string
	var lab *labeler
	if cfg.resource != nil {
		resource = []string{"resource"}
		lab = newLabeler(cfg.resource, cfg.limit)
	}
	cl := cfg.constLabels
	h := &Hooks{
		resource: lab,
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "redis_lock_expired_total",
			Help:        "Locks lost or expired before their holder released them: the TTL is too short for the work, or the holder paused.",
			ConstLabels: cl,
		}, resource),
		allLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "redis_lock_expired_all_total",
			Help:        "Locks lost or expired before their holder released them, all resources together; 0 from the start, so that increase() sees a loss on a resource label value first used between two scrapes.",
			ConstLabels: cl,
		}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "redis_lock_held",
			Help:        "Locks held now: acquired, neither released nor lost.",
			ConstLabels: cl,
		}, resource),
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "redis_lock_acquire_duration_seconds",
			Help:        "Duration of one acquisition round on the nodes, by outcome.",
			Buckets:     prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms to 4s
			ConstLabels: cl,
		}, []string{"outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "redis_lock_wait_duration_seconds",
			Help:        "Duration of a Lock or TryLock call, retries and waiting included, by outcome.",
			Buckets:     prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms to 262s
			ConstLabels: cl,
		}, []string{"outcome"}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "redis_lock_hold_duration_seconds",
			Help:        "Time from acquisition to release of a lock.",
			Buckets:     prometheus.ExponentialBuckets(0.01, 4, 10), // 10ms to 44min
			ConstLabels: cl,
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "redis_lock_renewal_lag_seconds",
			Help:        "Time from when a renewal was due to its confirmation by a majority; retries included.",
			Buckets:     prometheus.ExponentialBuckets(0.0005, 2, 17), // 0.5ms to 33s: above the default renew interval (10s)
			ConstLabels: cl,
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "redis_lock_renewal_failures_total",
			Help:        "Extension rounds (watchdog renewals and Extend calls) that failed, by reason: lost (the round ended with the lock lost; a lock whose validity ran out with no round ending then counts only in redis_lock_expired_total), no_quorum, error.",
			ConstLabels: cl,
		}, []string{"reason"}),
		margin: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "redis_lock_quorum_margin",
			Help:        "Nodes that neither failed nor refused a round (op=acquire, op=extend) by its decision, minus the quorum: how many more could have failed; negative: the round failed.",
			Buckets:     []float64{-3, -2, -1, 0, 1, 2},
			ConstLabels: cl,
		}, []string{"op"}),
		nodeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "redis_lock_node_errors_total",
			Help:        "Failed requests to one node, by operation and kind (timeout, canceled, connection, reply, busy, restarted).",
			ConstLabels: cl,
		}, []string{"node", "addr", "op", "kind"}),
		nodes:     newNodeHealth(cl),
		elections: newElectionMetrics(cl),
	}
	// Start the counters whose label values are known at zero, so that
	// their first increase is visible to rate() and increase().
	for _, r := range []string{reasonLost, reasonNoQuorum, reasonError} {
		h.failures.WithLabelValues(r)
	}
	if h.resource == nil {
		h.expired.WithLabelValues()
		h.held.WithLabelValues()
	}
	for _, e := range cfg.elections {
		h.elections.start(e)
	}
	return h
}

func (h *Hooks) collectors() []prometheus.Collector {
	return append([]prometheus.Collector{h.expired, h.allLost, h.held, h.acquire, h.wait, h.hold, h.lag, h.failures, h.margin, h.nodeErrs, h.nodes},
		h.elections.collectors()...)
}

// Describe implements prometheus.Collector.
func (h *Hooks) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range h.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (h *Hooks) Collect(ch chan<- prometheus.Metric) {
	for _, c := range h.collectors() {
		c.Collect(ch)
	}
}

// labels returns the resource label values of a lock on resource.
func (h *Hooks) labels(resource string) []string {
	if h.resource == nil {
		return nil
	}
	return []string{h.resource.value(resource)}
}

// Attempt observes the round's duration and quorum margin. The margin of a
// round cut short by ctx is not observed: its silent nodes were not
// waited for.
func (h *Hooks) Attempt(ctx context.Context, i redlock.AttemptInfo) {
	h.nodes.round(i.Nodes, i.Quorum)
	h.acquire.WithLabelValues(string(i.Outcome)).Observe(i.Latency.Seconds())
	if ctx.Err() == nil && i.Outcome != redlock.OutcomeClosed {
		h.margin.WithLabelValues("acquire").Observe(float64(i.Margin()))
	}
}

// Acquire observes the call's wait and counts an acquired lock as held.
func (h *Hooks) Acquire(_ context.Context, i redlock.AcquireInfo) {
	h.wait.WithLabelValues(string(i.Outcome)).Observe(i.Wait.Seconds())
	if i.Outcome != redlock.OutcomeAcquired {
		return
	}
	lv := h.labels(i.Resource)
	// The expired series of a resource starts at zero when it is first
	// locked, so that its first loss shows in increase().
	h.expired.WithLabelValues(lv...)
	h.held.WithLabelValues(lv...).Inc()
}

// Extend observes the renewal lag of a successful renewal, the quorum
// margin, and counts a failed round. A round that was cancelled (Unlock or
// Close stopped a renewal, or an Extend caller's ctx ended) is neither a
// failure nor a margin: its ctx is done and its error does not match
// ErrLockLost.
func (h *Hooks) Extend(ctx context.Context, i redlock.ExtendInfo) {
	h.nodes.round(i.Nodes, i.Quorum)
	if ctx.Err() != nil && !errors.Is(i.Err, redlock.ErrLockLost) {
		return
	}
	h.margin.WithLabelValues("extend").Observe(float64(i.Margin()))
	switch {
	case i.Err == nil:
		if i.Renewal {
			h.lag.Observe(max(i.Lag, 0).Seconds()) // a batched renewal may run a little before it is due
		}
	case errors.Is(i.Err, redlock.ErrLockLost):
		h.failures.WithLabelValues(reasonLost).Inc()
	case errors.Is(i.Err, redlock.ErrNoQuorum):
		h.failures.WithLabelValues(reasonNoQuorum).Inc()
	default:
		h.failures.WithLabelValues(reasonError).Inc()
	}
}

// Lost counts the lock as expired before its release, and no longer held.
// redlock reports Lost exactly once for every lock lost or expired before
// its release, and before that release.
func (h *Hooks) Lost(_ context.Context, i redlock.LostInfo) {
	h.count(i.Resource, -1, true)
}

// Release observes the hold time; a lock not lost before is no longer held
// (a lost one was counted by Lost).
func (h *Hooks) Release(_ context.Context, i redlock.ReleaseInfo) {
	h.hold.Observe(i.HeldFor.Seconds())
	if !i.WasLost {
		h.count(i.Resource, -1, false)
	}
}

func (h *Hooks) count(resource string, heldDelta int, expired bool) {
	if heldDelta == 0 && !expired {
		return
	}
	lv := h.labels(resource)
	if heldDelta != 0 {
		h.held.WithLabelValues(lv...).Add(float64(heldDelta))
	}
	if expired {
		h.expired.WithLabelValues(lv...).Inc()
		h.allLost.Inc()
	}
}

// NodeError counts the failed request, and the node as failing for
// [NodeFailureWindow] unless the error says nothing about the node
// (canceled, WRONGTYPE).
func (h *Hooks) NodeError(_ context.Context, i redlock.NodeErrorInfo) {
	h.nodes.nodeError(i)
	h.nodeErrs.WithLabelValues(strconv.Itoa(i.Node), i.Addr, i.Op, i.Kind).Inc()
}
