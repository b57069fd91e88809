package redlockotel

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/quorumlock/quorumlock/redlock"
)

const (
	// maxAttemptSpans caps the attempt spans of one Lock call, keeping the
	// latest: a call that waits for minutes makes an attempt every retry
	// delay. The call's span has the full count in redlock.attempts.
	maxAttemptSpans = 32
	// maxCalls bounds the calls whose attempts are kept; past it, attempts
	// older than staleAttempt are dropped.
	maxCalls     = 1024
	staleAttempt = 10 * time.Minute
)

// Span attribute keys, besides the metric ones.
const (
	keyAttempts  = attribute.Key("redlock.attempts")
	keyAttempt   = attribute.Key("redlock.attempt")
	keyFence     = attribute.Key("redlock.fence")
	keyGranted   = attribute.Key("redlock.granted")
	keyHandoff   = attribute.Key("redlock.handoff") // granted by releases, no round of its own
	keyLocal     = attribute.Key("redlock.local")   // passed between goroutines of one Client, no node involved (redlock.WithLocalHandoff)
	keyConfirmed = attribute.Key("redlock.confirmed")
	keyHealed    = attribute.Key("redlock.healed")
	keyQuorum    = attribute.Key("redlock.quorum")
	keyNodes     = attribute.Key("redlock.nodes")
	keyRenewal   = attribute.Key("redlock.renewal")
	keyLag       = attribute.Key("redlock.renewal.lag")
	keyHeldFor   = attribute.Key("redlock.held_for")
	keyWasLost   = attribute.Key("redlock.was_lost")
	keyReleased  = attribute.Key("redlock.released")
	keyErrMsg    = attribute.Key("error.message")
)

// attempts keeps the attempts of each Lock call until the call ends. Spans
// are made after the fact from the hooks, and Attempt is reported before
// the Acquire of its call, so the call's span, parent of the attempts',
// does not exist yet when an attempt ends.
//
// Attempts are filed under their call's ID (AttemptInfo.Call), ctx and
// resource, and Acquire takes the AcquireInfo.Attempts latest ones filed
// under its own. The ID alone is unique only within a Client; with ctx
// and resource beside it, calls of two Clients sharing these Hooks are
// told apart too. (Matching by the instants the hooks were called at
// instead missed an attempt whose hook ran more than a slack late on a
// busy machine.)
type attempts struct {
	mu sync.Mutex // protects m
	m  map[callKey][]attemptRec
}

type callKey struct {
	call     uint64 // AttemptInfo.Call, AcquireInfo.Call
	resource string
	ctx      uintptr // the address of the call's ctx if it is a pointer; 0 otherwise
}

type attemptRec struct {
	start, end time.Time
	info       redlock.AttemptInfo
}

func newAttempts() *attempts { return &attempts{m: make(map[callKey][]attemptRec)} }

func keyOf(ctx context.Context, call uint64, resource string) callKey {
	k := callKey{call: call, resource: resource}
	// Compare addresses, never ctx values: a ctx of a struct type with a
	// slice inside would panic as a map key.
	if v := reflect.ValueOf(ctx); v.Kind() == reflect.Pointer {
		k.ctx = v.Pointer()
	}
	return k
}

func (a *attempts) add(k callKey, r attemptRec) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= maxCalls {
		a.dropStale(r.end)
	}
	recs := a.m[k]
	if len(recs) == maxAttemptSpans {
		recs = append(recs[:0], recs[1:]...)
	}
	a.m[k] = append(recs, r)
}

// take removes and returns the latest n attempts under k, oldest first.
func (a *attempts) take(k callKey, n int) []attemptRec {
	a.mu.Lock()
	defer a.mu.Unlock()
	recs := a.m[k]
	var out []attemptRec
	keep := recs[:0:0]
	for i := len(recs) - 1; i >= 0; i-- {
		if len(out) < n {
			out = append(out, recs[i])
		} else {
			keep = append(keep, recs[i])
		}
	}
	if len(keep) == 0 {
		delete(a.m, k)
	} else {
		reverse(keep)
		a.m[k] = keep
	}
	reverse(out)
	return out
}

// dropStale forgets attempts that ended staleAttempt before now: their
// call can no longer be running without having made newer ones.
func (a *attempts) dropStale(now time.Time) {
	for k, recs := range a.m {
		if now.Sub(recs[len(recs)-1].end) > staleAttempt {
			delete(a.m, k)
		}
	}
}

func reverse(rs []attemptRec) {
	for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
		rs[i], rs[j] = rs[j], rs[i]
	}
}

// attemptSpan keeps the attempt until its call's Acquire.
func (h *Hooks) attemptSpan(ctx context.Context, i redlock.AttemptInfo) {
	end := time.Now()
	h.attempts.add(keyOf(ctx, i.Call, i.Resource), attemptRec{start: end.Add(-i.Latency), end: end, info: i})
}

// acquireSpan makes the span of a Lock or TryLock call, parented on the
// span in ctx, and a child span for each of its attempts.
func (h *Hooks) acquireSpan(ctx context.Context, i redlock.AcquireInfo) {
	end := time.Now()
	start := end.Add(-i.Wait)
	recs := h.attempts.take(keyOf(ctx, i.Call, i.Resource), i.Attempts)
	attrs := []attribute.KeyValue{KeyResource.String(i.Resource), KeyOutcome.String(string(i.Outcome)), keyAttempts.Int(i.Attempts)}
	if i.Fence != 0 {
		attrs = append(attrs, keyFence.Int64(i.Fence))
	}
	if i.Local {
		attrs = append(attrs, keyLocal.Bool(true))
	}
	cctx, span := h.tracer.Start(ctx, "redlock.acquire", trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	first := i.Attempts - len(recs) + 1 // attempts beyond the cap were dropped, oldest first
	for n, r := range recs {
		// Keep the estimated instants within the call's span.
		if r.start.Before(start) {
			r.start = start
		}
		if r.end.After(end) {
			r.end = end
		}
		_, s := h.tracer.Start(cctx, "redlock.attempt", trace.WithTimestamp(r.start), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(KeyResource.String(i.Resource), keyAttempt.Int(first+n), KeyOutcome.String(string(r.info.Outcome)),
				keyGranted.Int(r.info.Granted), keyQuorum.Int(r.info.Quorum), keyNodes.Int(r.info.Nodes)))
		if r.info.Handoff {
			s.SetAttributes(keyHandoff.Bool(true))
		}
		nodeEvents(s, roundNodeErrors(r.info.NodeErrors, r.info.Err), r.end)
		outcomeStatus(s, r.info.Outcome, r.info.Err)
		s.End(trace.WithTimestamp(r.end))
	}
	outcomeStatus(span, i.Outcome, i.Err)
	span.End(trace.WithTimestamp(end))
}

// outcomeStatus marks a span failed unless the lock was acquired or
// refused (also as the caller's own lock: already_held): a refusal is the
// lock working, not a fault.
func outcomeStatus(s trace.Span, o redlock.Outcome, err error) {
	if o == redlock.OutcomeAcquired || o == redlock.OutcomeNotObtained || o == redlock.OutcomeAlreadyHeld || err == nil {
		return
	}
	s.SetStatus(codes.Error, err.Error())
}

// extendSpan makes the span of an Extend call (parented on its ctx) or of a
// renewal (a root: renewals run on no caller's ctx).
func (h *Hooks) extendSpan(ctx context.Context, i redlock.ExtendInfo) {
	if i.Renewal && i.Err == nil && !h.renewalSpans {
		return
	}
	end := time.Now()
	attrs := []attribute.KeyValue{KeyResource.String(i.Resource), keyRenewal.Bool(i.Renewal),
		keyConfirmed.Int(i.Confirmed), keyHealed.Int(i.Healed), keyQuorum.Int(i.Quorum), keyNodes.Int(i.Nodes)}
	if i.Renewal && i.Err == nil {
		attrs = append(attrs, keyLag.Float64(max(i.Lag, 0).Seconds()))
	}
	_, s := h.tracer.Start(ctx, "redlock.extend", trace.WithTimestamp(end.Add(-i.Latency)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	nodeEvents(s, roundNodeErrors(i.NodeErrors, i.Err), end)
	if i.Err != nil {
		s.SetStatus(codes.Error, i.Err.Error())
	}
	s.End(trace.WithTimestamp(end))
}

// lostSpan marks the moment of a loss with an empty span, parented on the
// span in the ctx given to Lock (the lock's Context carries its values).
func (h *Hooks) lostSpan(ctx context.Context, i redlock.LostInfo) {
	now := time.Now()
	_, s := h.tracer.Start(ctx, "redlock.lost", trace.WithTimestamp(now), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(KeyResource.String(i.Resource), keyHeldFor.Float64(i.HeldFor.Seconds())))
	if i.Err != nil {
		s.SetStatus(codes.Error, i.Err.Error())
	}
	s.End(trace.WithTimestamp(now))
}

// releaseSpan makes the span of a release, parented on the span in the ctx
// given to Unlock. ReleaseInfo carries no duration of the release round, so
// the span is empty, at the moment the release ended.
func (h *Hooks) releaseSpan(ctx context.Context, i redlock.ReleaseInfo) {
	now := time.Now()
	_, s := h.tracer.Start(ctx, "redlock.release", trace.WithTimestamp(now), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(KeyResource.String(i.Resource), keyHeldFor.Float64(i.HeldFor.Seconds()),
			keyWasLost.Bool(i.WasLost), keyReleased.Int(i.Released)))
	if i.Local {
		s.SetAttributes(keyLocal.Bool(true))
	}
	nodeEvents(s, nodeErrorsIn(i.Err), now)
	if i.Err != nil {
		s.SetStatus(codes.Error, i.Err.Error())
	}
	s.End(trace.WithTimestamp(now))
}

// nodeEvents adds an event per failed node, dated at, the end of the round:
// the infos do not say when each node failed.
func nodeEvents(s trace.Span, nes []*redlock.NodeError, at time.Time) {
	for _, ne := range nes {
		s.AddEvent("redlock.node_error", trace.WithTimestamp(at), trace.WithAttributes(
			KeyNode.Int(ne.Node), KeyNodeAddr.String(ne.Addr), KeyErrType.String(ne.Kind()), keyErrMsg.String(ne.Err.Error())))
	}
}

// roundNodeErrors returns the failed nodes of a round: those the info
// lists, and those joined in its error. A node the fan-out stopped waiting
// for (the node timeout) is only in the error: the infos list the
// *redlock.NodeError values of the tally, where such a node has a bare
// timeout error.
func roundNodeErrors(listed []*redlock.NodeError, err error) []*redlock.NodeError {
	out := listed
	for _, ne := range nodeErrorsIn(err) {
		if !slices.ContainsFunc(out, func(l *redlock.NodeError) bool { return l.Node == ne.Node }) {
			out = append(out, ne)
		}
	}
	return out
}

// nodeErrorsIn returns the *redlock.NodeError values joined in err.
func nodeErrorsIn(err error) []*redlock.NodeError {
	var out []*redlock.NodeError
	var walk func(error)
	walk = func(err error) {
		if ne, ok := err.(*redlock.NodeError); ok {
			out = append(out, ne)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}
