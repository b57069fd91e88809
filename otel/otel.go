// Package redlockotel reports what the locks of a [redlock.Client] do
// through OpenTelemetry: metrics through go.opentelemetry.io/otel/metric,
// and spans around acquisition, extension and release. It is a module of its
// own, so that the core module does not depend on OpenTelemetry.
//
//	h, err := redlockotel.New() // the global MeterProvider and TracerProvider
//	c, err := redlock.New(nodes, redlock.WithHooks(h))
//
// The instruments:
//
//	redlock.expired          counter        {lock}  locks lost or expired before their holder released them; redlock.resource
//	redlock.expired.all      counter        {lock}  the same, all resources together, no attributes; 0 from New on
//	redlock.held             updowncounter  {lock}  locks held now; redlock.resource
//	redlock.acquire.duration histogram      s       one acquisition round on the nodes; redlock.outcome
//	redlock.wait.duration    histogram      s       a whole Lock or TryLock call, retries included; redlock.outcome
//	redlock.hold.duration    histogram      s       from acquisition to release
//	redlock.renewal.lag      histogram      s       from when a renewal was due to its confirmation
//	redlock.renewal.failures counter        {round} extension rounds that failed; redlock.reason (lost, no_quorum, error)
//	redlock.quorum.margin    histogram      {node}  nodes that neither failed nor refused a round by its decision, minus the quorum (AttemptInfo.Margin, ExtendInfo.Margin); redlock.op (acquire, extend)
//	redlock.node.errors      counter        {error} failed requests to one node; redlock.node, redlock.node.addr, redlock.op, error.type
//
// It implements election.Hooks as well: pass the same Hooks to
// election.WithHooks for the leadership instruments (see election.go):
// redlock.election.leader, redlock.election.changes,
// redlock.election.term.duration and redlock.election.campaign.duration,
// with the attribute redlock.election (the election's name).
//
// The spans, created when the hooks report an operation, and dated from the
// durations the hooks carry:
//
//	redlock.acquire  one Lock or TryLock call, child of the span in the call's ctx
//	redlock.attempt  one acquisition round, child of redlock.acquire; an event per failed node
//	redlock.extend   an Extend call, or a renewal by the watchdog (failed ones only, unless WithRenewalSpans(true)); an event per failed node
//	redlock.release  an Unlock, or a release by Close; an event per failed node
//	redlock.lost     the moment a lock was lost, child of the span in the ctx given to Lock
//
// The redlock.resource attribute of metrics is bounded by default: the part
// of the resource name before the first ":" ("invoice:1234" → "invoice"),
// so names that embed an id do not make one series per id. Choose another
// mapping with [WithResourceAttribute], drop it with
// [WithoutResourceAttribute], or opt in to full names with
// [WithFullResourceAttribute]. Spans always carry the full name.
package redlockotel

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/quorumlock/quorumlock/redlock"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/quorumlock/quorumlock/otel"

// Attribute keys.
const (
	KeyResource = attribute.Key("redlock.resource")
	KeyOutcome  = attribute.Key("redlock.outcome")
	KeyReason   = attribute.Key("redlock.reason")
	KeyOp       = attribute.Key("redlock.op")
	KeyNode     = attribute.Key("redlock.node")
	KeyNodeAddr = attribute.Key("redlock.node.addr")
	KeyErrType  = attribute.Key("error.type")
)

// Failure reasons of redlock.renewal.failures.
const (
	reasonLost     = "lost"      // the round ended with the lock lost: a majority said not ours, or it ended at or after ValidUntil
	reasonNoQuorum = "no_quorum" // too few nodes confirmed; retried while validity remains
	reasonError    = "error"     // anything else
)

// Option configures New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	mp           metric.MeterProvider
	tp           trace.TracerProvider
	resource     func(string) string // nil: the attribute is dropped from metrics
	renewalSpans bool
}

// WithMeterProvider sets where the metrics go. The default is the global
// MeterProvider (otel.GetMeterProvider) at the time of New.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithTracerProvider sets where the spans go. The default is the global
// TracerProvider (otel.GetTracerProvider) at the time of New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithResourceAttribute sets the value of the redlock.resource attribute of
// the metrics of a lock on resource: f(resource). f must return few
// distinct values, since each makes its own series, and be safe for
// concurrent use. The default is [ResourcePrefix](":"): "invoice:1234" →
// "invoice". Spans keep the full name.
func WithResourceAttribute(f func(resource string) string) Option {
	return optionFunc(func(c *config) { c.resource = f })
}

// WithFullResourceAttribute makes the redlock.resource attribute of the
// metrics the full resource name.
//
// Warning: every distinct resource name then makes its own series of
// redlock.expired and redlock.held, kept for the life of the process and in
// the backend the metrics are exported to. Names that embed an id
// ("invoice:1234") grow them without bound. Use it only when resource names
// come from a small fixed set.
func WithFullResourceAttribute() Option {
	return optionFunc(func(c *config) { c.resource = func(r string) string { return r } })
}

// WithoutResourceAttribute drops the redlock.resource attribute from the
// metrics: redlock.expired and redlock.held become one series each.
func WithoutResourceAttribute() Option {
	return optionFunc(func(c *config) { c.resource = nil })
}

// WithRenewalSpans(true) makes a span of every renewal by the watchdog: one
// per lock every renew interval. By default only renewals that failed make
// a span (metrics cover the others). Renewals run on no caller's ctx, so
// their spans are roots.
func WithRenewalSpans(on bool) Option {
	return optionFunc(func(c *config) { c.renewalSpans = on })
}

// ResourcePrefix returns a mapping for WithResourceAttribute that keeps the
// part of a resource name before the first sep: with ":", "invoice:1234"
// becomes "invoice". A name without sep is kept whole. ResourcePrefix(":")
// is the default mapping.
func ResourcePrefix(sep string) func(string) string {
	return func(resource string) string {
		prefix, _, _ := strings.Cut(resource, sep)
		return prefix
	}
}

// Hooks turn the events of a redlock.Client into OpenTelemetry metrics and
// spans. It implements [redlock.Hooks]: pass it to [redlock.WithHooks]. One
// Hooks may serve several Clients. It is safe for concurrent use; every
// method returns without blocking on I/O (the SDK's exporters batch).
type Hooks struct {
	redlock.NoHooks // methods added to redlock.Hooks later do nothing here

	tracer       trace.Tracer
	resource     func(string) string // nil: no resource attribute on metrics
	renewalSpans bool
	attempts     *attempts

	expired metric.Int64Counter
	// expiredAll is expired without attributes: one series, at 0 from New
	// on, so that a backend that alerts on its growth sees the first loss
	// of a resource never seen before (a series created by the loss itself
	// starts at 1, and its growth is not seen).
	expiredAll metric.Int64Counter
	held       metric.Int64UpDownCounter
	acquire    metric.Float64Histogram
	wait       metric.Float64Histogram
	hold       metric.Float64Histogram
	lag        metric.Float64Histogram
	failures   metric.Int64Counter
	margin     metric.Int64Histogram
	nodeErrs   metric.Int64Counter

	elections *electionInstruments // election.Hooks (election.go)
}

var _ redlock.Hooks = (*Hooks)(nil)

var noAttributes = metric.WithAttributeSet(attribute.NewSet())

// Bucket boundaries, in seconds for durations: the SDK's defaults are made
// for milliseconds.
var (
	roundBuckets  = exponential(0.0005, 2, 14) // 0.5ms to 4s
	waitBuckets   = exponential(0.001, 4, 10)  // 1ms to 262s
	holdBuckets   = exponential(0.01, 4, 10)   // 10ms to 44min
	marginBuckets = []float64{-3, -2, -1, 0, 1, 2}
)

func exponential(start, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

// New returns Hooks whose instruments are made on the configured meter. It
// returns the errors of the instruments that could not be made.
func New(opts ...Option) (*Hooks, error) {
	cfg := config{resource: ResourcePrefix(":")}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	m := cfg.mp.Meter(ScopeName)
	h := &Hooks{
		tracer:       cfg.tp.Tracer(ScopeName),
		resource:     cfg.resource,
		renewalSpans: cfg.renewalSpans,
		attempts:     newAttempts(),
	}
	var err, e error
	h.expired, e = m.Int64Counter("redlock.expired", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks lost or expired before their holder released them: the TTL is too short for the work, or the holder paused."))
	err = errors.Join(err, e)
	h.expiredAll, e = m.Int64Counter("redlock.expired.all", metric.WithUnit("{lock}"),
		metric.WithDescription("redlock.expired, all resources together, without attributes; 0 from the start, so that the first loss of a resource is seen as growth."))
	err = errors.Join(err, e)
	if e == nil {
		h.expiredAll.Add(context.Background(), 0)
	}
	h.held, e = m.Int64UpDownCounter("redlock.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held now: acquired, neither released nor lost."))
	err = errors.Join(err, e)
	h.acquire, e = m.Float64Histogram("redlock.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one acquisition round on the nodes, by outcome."),
		metric.WithExplicitBucketBoundaries(roundBuckets...))
	err = errors.Join(err, e)
	h.wait, e = m.Float64Histogram("redlock.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a Lock or TryLock call, retries and waiting included, by outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	err = errors.Join(err, e)
	h.hold, e = m.Float64Histogram("redlock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from acquisition to release of a lock."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	err = errors.Join(err, e)
	h.lag, e = m.Float64Histogram("redlock.renewal.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from when a renewal was due to its confirmation by a majority; retries included."),
		metric.WithExplicitBucketBoundaries(roundBuckets...))
	err = errors.Join(err, e)
	h.failures, e = m.Int64Counter("redlock.renewal.failures", metric.WithUnit("{round}"),
		metric.WithDescription("Extension rounds (watchdog renewals and Extend calls) that failed, by reason: lost, no_quorum, error."))
	err = errors.Join(err, e)
	h.margin, e = m.Int64Histogram("redlock.quorum.margin", metric.WithUnit("{node}"),
		metric.WithDescription("Nodes that granted (acquire) or confirmed (extend) a round, minus the quorum; negative: the round failed."),
		metric.WithExplicitBucketBoundaries(marginBuckets...))
	err = errors.Join(err, e)
	h.nodeErrs, e = m.Int64Counter("redlock.node.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed requests to one node, by operation and kind (timeout, canceled, connection, reply, busy, restarted)."))
	err = errors.Join(err, e)
	h.elections, e = newElectionInstruments(m)
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// resourceSet returns the metric attributes of a lock on resource.
func (h *Hooks) resourceSet(resource string) metric.MeasurementOption {
	if h.resource == nil {
		return noAttributes
	}
	return metric.WithAttributes(KeyResource.String(h.resource(resource)))
}

// Attempt observes the round's duration and quorum margin, and keeps the
// round for the span of its Lock call. The margin of a round cut short by
// ctx is not observed: its silent nodes were not waited for.
func (h *Hooks) Attempt(ctx context.Context, i redlock.AttemptInfo) {
	h.acquire.Record(ctx, i.Latency.Seconds(), metric.WithAttributes(KeyOutcome.String(string(i.Outcome))))
	if ctx.Err() == nil && i.Outcome != redlock.OutcomeClosed {
		h.margin.Record(ctx, int64(i.Margin()), metric.WithAttributes(KeyOp.String("acquire")))
	}
	h.attemptSpan(ctx, i)
}

// Acquire observes the call's wait, counts an acquired lock as held, and
// makes the spans of the call and its attempts.
func (h *Hooks) Acquire(ctx context.Context, i redlock.AcquireInfo) {
	h.wait.Record(ctx, i.Wait.Seconds(), metric.WithAttributes(KeyOutcome.String(string(i.Outcome))))
	if i.Outcome == redlock.OutcomeAcquired {
		// redlock.expired starts at zero for the resource, so that its first
		// loss is an increase an alert can see.
		h.expired.Add(ctx, 0, h.resourceSet(i.Resource))
		h.held.Add(ctx, 1, h.resourceSet(i.Resource))
	}
	h.acquireSpan(ctx, i)
}

// Extend observes the renewal lag of a successful renewal, the quorum
// margin, counts a failed round, and makes its span. A round that was
// cancelled (Unlock or Close stopped a renewal, or an Extend caller's ctx
// ended) is neither a failure nor a margin: its ctx is done and its error
// does not match ErrLockLost. A cancelled Extend call keeps its span.
func (h *Hooks) Extend(ctx context.Context, i redlock.ExtendInfo) {
	cancelled := ctx.Err() != nil && !errors.Is(i.Err, redlock.ErrLockLost)
	if cancelled && i.Renewal {
		return
	}
	if !cancelled {
		h.margin.Record(ctx, int64(i.Margin()), metric.WithAttributes(KeyOp.String("extend")))
		switch {
		case i.Err == nil:
			if i.Renewal {
				h.lag.Record(ctx, max(i.Lag, 0).Seconds()) // a batched renewal may run a little before it is due
			}
		case errors.Is(i.Err, redlock.ErrLockLost):
			h.failures.Add(ctx, 1, metric.WithAttributes(KeyReason.String(reasonLost)))
		case errors.Is(i.Err, redlock.ErrNoQuorum):
			h.failures.Add(ctx, 1, metric.WithAttributes(KeyReason.String(reasonNoQuorum)))
		default:
			h.failures.Add(ctx, 1, metric.WithAttributes(KeyReason.String(reasonError)))
		}
	}
	h.extendSpan(ctx, i)
}

// Lost counts the lock as expired and no longer held, and marks the moment
// with a span.
// redlock reports Lost exactly once for every lock lost or expired before
// its release, and before that release.
func (h *Hooks) Lost(ctx context.Context, i redlock.LostInfo) {
	h.count(ctx, i.Resource, -1, true)
	h.lostSpan(ctx, i)
}

// Release observes the hold time and makes the release's span; a lock not
// lost before is no longer held (a lost one was counted by Lost).
func (h *Hooks) Release(ctx context.Context, i redlock.ReleaseInfo) {
	h.hold.Record(ctx, i.HeldFor.Seconds())
	if !i.WasLost {
		h.count(ctx, i.Resource, -1, false)
	}
	h.releaseSpan(ctx, i)
}

func (h *Hooks) count(ctx context.Context, resource string, heldDelta int, expired bool) {
	if heldDelta != 0 {
		h.held.Add(ctx, int64(heldDelta), h.resourceSet(resource))
	}
	if expired {
		h.expired.Add(ctx, 1, h.resourceSet(resource))
		h.expiredAll.Add(ctx, 1)
	}
}

// NodeError counts the failed request.
func (h *Hooks) NodeError(ctx context.Context, i redlock.NodeErrorInfo) {
	h.nodeErrs.Add(ctx, 1, metric.WithAttributes(KeyNode.Int(i.Node), KeyNodeAddr.String(i.Addr),
		KeyOp.String(i.Op), KeyErrType.String(i.Kind)))
}
