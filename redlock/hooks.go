package redlock

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/quorum"
)

// Hooks observe what a Client's locks do, for logs, metrics and traces. The
// adapters in the nested modules otel/ and prometheus/ implement it.
// Embed NoHooks to implement only some methods.
//
// Methods are called synchronously on the goroutine doing the work (a Lock
// call, a renewal, an Unlock), never while the library holds a mutex —
// except Lost: a loss is signalled first (Lost() closed, Context()
// cancelled), then Lost is called on a goroutine of the Client's own, one
// per lost lock, so that no hook delays any lock's loss signal. ctx is the
// caller's context (for Attempt, Acquire, Release, and Extend from an
// Extend call), the lock's Context for Lost (cancelled by then; its values
// remain), a background context for renewals, and the request's context
// for NodeError; a tracing adapter can parent spans on it. Info fields with
// a time (Latency, Wait) let an adapter date its spans. They must be safe
// for concurrent use, return quickly and never block: a slow hook delays
// acquisitions and renewals, a slow Lost delays the lock's Release and its
// OnLost, and Close waits for Lost. A hook must not call Close. Tokens are
// never passed to hooks.
type Hooks interface {
	// Attempt is called after each acquisition round on the nodes.
	Attempt(ctx context.Context, info AttemptInfo)
	// Acquire is called when a Lock or TryLock call ends, acquired or not.
	Acquire(ctx context.Context, info AcquireInfo)
	// Extend is called after each extension round: a renewal, or Extend.
	Extend(ctx context.Context, info ExtendInfo)
	// Lost is called exactly once for every lock lost or expired before its
	// release, and before that release's Release call; never for a lock
	// released in time.
	Lost(ctx context.Context, info LostInfo)
	// Release is called when Unlock or Close has released a lock.
	Release(ctx context.Context, info ReleaseInfo)
	// NodeError is called for every request to a node that failed.
	NodeError(ctx context.Context, info NodeErrorInfo)
}

// NoHooks implements Hooks with methods that do nothing; embed it.
type NoHooks struct{}

func (NoHooks) Attempt(context.Context, AttemptInfo)     {}
func (NoHooks) Acquire(context.Context, AcquireInfo)     {}
func (NoHooks) Extend(context.Context, ExtendInfo)       {}
func (NoHooks) Lost(context.Context, LostInfo)           {}
func (NoHooks) Release(context.Context, ReleaseInfo)     {}
func (NoHooks) NodeError(context.Context, NodeErrorInfo) {}

// Outcome is how an acquisition attempt or call ended.
type Outcome string

// The outcomes.
const (
	OutcomeAcquired    Outcome = "acquired"
	OutcomeNotObtained Outcome = "not_obtained" // another owner holds it
	// OutcomeGrantExpired: a majority granted, too late to use
	// (ErrGrantExpired): the round outlasted the TTL less the drift
	// allowance, or the process was starved; nobody else need hold it.
	OutcomeGrantExpired Outcome = "grant_expired"
	// OutcomeAlreadyHeld: the caller holds the lock already (ErrAlreadyHeld,
	// its ctx comes from its own lock); the call returned at once, with no
	// round, so only a call (AcquireInfo), never an attempt, ends so.
	OutcomeAlreadyHeld Outcome = "already_held"
	OutcomeNoQuorum    Outcome = "no_quorum" // too few nodes answered
	OutcomeCanceled    Outcome = "canceled"  // ctx ended
	OutcomeClosed      Outcome = "closed"    // the Client was closed
	OutcomeError       Outcome = "error"     // anything else, e.g. bad input
)

func outcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeAcquired
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if !errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotObtained) {
			return OutcomeCanceled
		}
		return OutcomeNoQuorum
	case errors.Is(err, ErrGrantExpired):
		return OutcomeGrantExpired
	case errors.Is(err, ErrAlreadyHeld):
		return OutcomeAlreadyHeld
	case errors.Is(err, ErrNotObtained):
		return OutcomeNotObtained
	case errors.Is(err, ErrNoQuorum):
		return OutcomeNoQuorum
	}
	return OutcomeError
}

// AttemptInfo describes one acquisition round.
type AttemptInfo struct {
	Call     uint64 // the Lock or TryLock call it belongs to (see AcquireInfo.Call)
	Resource string
	Latency  time.Duration // from the first request to the decision (both phases with fencing)
	Granted  int           // nodes that had granted when the round was decided (see Margin)
	Pending  int           // nodes that had not answered when the round was decided
	Quorum   int           // nodes needed
	Nodes    int
	Outcome  Outcome
	Err      error
	// NodeErrors lists the nodes that failed in this round (also reported
	// one by one through NodeError).
	NodeErrors []*NodeError
	// Handoff is set when no round was sent: releases handed the key to
	// this call's token on Granted nodes, a majority, which made it the
	// holder (DESIGN step 9). Latency is then 0.
	Handoff bool
}

// Margin is the round's quorum margin: Granted + Pending − Quorum, the
// nodes that neither failed nor refused by the time the round was
// decided, less the quorum — how many more of them could have failed
// without failing the round. A round stops waiting once a majority
// granted, so Granted alone is the quorum on every healthy round (its
// margin would read 0 for ever); the nodes it did not wait for count as
// not failed. A granted round has a margin ≥ 0, one refused or failed by
// its nodes < 0; a round whose majority answered too late to leave any
// validity fails with whatever margin its nodes gave (its error says
// why). A node that answers slower than the others (paused, say) shows
// here only once it fails a round; its timeouts show at once in
// NodeError.
func (i AttemptInfo) Margin() int { return i.Granted + i.Pending - i.Quorum }

// AcquireInfo describes a whole Lock or TryLock call.
type AcquireInfo struct {
	Call     uint64 // unique per call within the Client: pairs attempts with their call
	Lock     uint64 // the acquired lock's ID (0 if none): pairs its later events
	Resource string
	Wait     time.Duration // from the call to its return
	Attempts int
	Outcome  Outcome
	Fence    int64 // with WithFencing, the lock's token
	Err      error
	// Local is set when the lock was passed to the call by another
	// goroutine of this Client that unlocked it (a local handoff, see
	// WithLocalHandoff): an acquisition with no round (Attempts is 0).
	Local bool
}

// ExtendInfo describes one extension round.
type ExtendInfo struct {
	Lock      uint64 // the lock's ID, as in AcquireInfo
	Resource  string
	Renewal   bool          // by the watchdog (false: an Extend call)
	Lag       time.Duration // renewals: from when the renewal was due to its confirmation (0 if batched early)
	Latency   time.Duration // the round itself
	Confirmed int           // nodes where the key was ours when the round was decided (see Margin)
	Pending   int           // nodes that had not answered when the round was decided
	Healed    int           // of the confirmed, where the key had to be set again (the node had lost it)
	Quorum    int
	Nodes     int
	Err       error // nil on success; matches ErrLockLost when the round lost the lock
	// NodeErrors lists the nodes that failed in this round.
	NodeErrors []*NodeError
}

// Margin is the round's quorum margin: Confirmed + Pending − Quorum, the
// nodes that neither failed nor refused by the time the round was decided,
// less the quorum — how many more of them could have failed without
// failing the round: 1 on a healthy round of 3 nodes, 2 of 5; 0 with one
// of 3 down when its failure came before the decision (a refused
// connection usually does). A round stops waiting once a majority
// confirmed, so Confirmed alone is the quorum on every healthy round (its
// margin would read 0 for ever); the nodes it did not wait for count as
// not failed. A successful round has a margin ≥ 0, one failed by its
// nodes < 0; a round whose majority confirmed too late, after the lock's
// validity ran out, fails with whatever margin its nodes gave (seen with
// 3 confirmed and 1 pending of 5: margin 1; its error says why). A
// node that answers slower than the others (paused, say) shows here only
// once it fails a round that needed it; its timeouts show at once in
// NodeError.
func (i ExtendInfo) Margin() int { return i.Confirmed + i.Pending - i.Quorum }

// LostInfo describes a lost lock.
type LostInfo struct {
	Lock     uint64
	Resource string
	HeldFor  time.Duration
	Err      error // matches ErrLockLost; says why
}

// ReleaseInfo describes the release of a lock by Unlock or Close.
type ReleaseInfo struct {
	Lock     uint64
	Resource string
	Latency  time.Duration // the release round
	HeldFor  time.Duration // from acquisition to release
	WasLost  bool          // the lock was lost (or had expired) before this release — the TTL was too short or the process paused; Lost was reported for it first, exactly once
	Released int           // nodes where our key was deleted
	Err      error
	// NodeErrors lists the nodes that failed in the release round.
	NodeErrors []*NodeError
	// Local is set when the lock was not released but passed to another
	// goroutine of this Client waiting for it (a local handoff, see
	// WithLocalHandoff): no node was sent anything, and the next holder's
	// Lock call reports an acquisition with Local set.
	Local bool
}

// NodeErrorInfo describes one failed request to one node.
type NodeErrorInfo struct {
	Resource string
	Op       string // "acquire", "commit", "extend", "release", "exists", "dial", "publish" (a release's wake-up message was refused; the release succeeded)
	Node     int
	Addr     string
	Kind     string // "timeout", "canceled", "connection", "reply" (an error reply such as WRONGTYPE or NOPERM), "busy", "restarted" (see WithRestartGuard)
	Err      error
}

// nodeErrors collects one *NodeError per failed node of a round, timeouts
// (where the fan-out stopped waiting) included.
func (c *Client) nodeErrors(t quorum.Tally) []*NodeError {
	var out []*NodeError
	for i, e := range t.Errs {
		if e == nil {
			continue
		}
		var ne *NodeError
		if !errors.As(e, &ne) {
			ne = &NodeError{Node: i, Addr: c.nodes[i].Addr, Err: c.nodes[i].Health.Cause(e)}
		}
		out = append(out, ne)
	}
	return out
}

// Kind classifies the node's error: "timeout" (no reply within the node
// timeout, or not sent to a node with a request past its deadline),
// "canceled", "connection" (a dial refused or unresolvable, or another
// transport error; the error then says the dialer's message),
// "reply" (an error reply such as WRONGTYPE or NOPERM), "busy" (too many
// requests in flight on the node from this Client) or "restarted" (the
// node is younger than the restart guard).
func (e *NodeError) Kind() string { return errorKind(e.Err) }

func errorKind(err error) string {
	var ne net.Error
	var re redis.Error
	// The node layer's own failures say their kind ("connection": the
	// node's dials fail; "busy": its in-flight cap was full).
	var nk interface{ FailureKind() string }
	if errors.As(err, &nk) {
		return nk.FailureKind()
	}
	switch {
	case errors.Is(err, ErrNodeRestarted):
		return "restarted"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &re):
		return "reply"
	}
	return "connection"
}

type multiHooks []Hooks

func (m multiHooks) Attempt(ctx context.Context, i AttemptInfo) {
	for _, h := range m {
		h.Attempt(ctx, i)
	}
}
func (m multiHooks) Acquire(ctx context.Context, i AcquireInfo) {
	for _, h := range m {
		h.Acquire(ctx, i)
	}
}
func (m multiHooks) Extend(ctx context.Context, i ExtendInfo) {
	for _, h := range m {
		h.Extend(ctx, i)
	}
}
func (m multiHooks) Lost(ctx context.Context, i LostInfo) {
	for _, h := range m {
		h.Lost(ctx, i)
	}
}
func (m multiHooks) Release(ctx context.Context, i ReleaseInfo) {
	for _, h := range m {
		h.Release(ctx, i)
	}
}
func (m multiHooks) NodeError(ctx context.Context, i NodeErrorInfo) {
	for _, h := range m {
		h.NodeError(ctx, i)
	}
}

// logHooks writes structured logs.
type logHooks struct{ l *slog.Logger }

func (h logHooks) Attempt(ctx context.Context, _ AttemptInfo) {}

func (h logHooks) Acquire(ctx context.Context, i AcquireInfo) {
	lvl := slog.LevelDebug
	if i.Outcome != OutcomeAcquired && i.Outcome != OutcomeNotObtained && i.Outcome != OutcomeAlreadyHeld && i.Outcome != OutcomeCanceled {
		lvl = slog.LevelWarn
	}
	h.l.Log(ctx, lvl, "redlock: acquire", "resource", i.Resource, "outcome", string(i.Outcome),
		"wait", i.Wait, "attempts", i.Attempts, "fence", i.Fence, "err", i.Err)
}

func (h logHooks) Extend(ctx context.Context, i ExtendInfo) {
	if i.Err == nil {
		if i.Healed > 0 {
			h.l.InfoContext(ctx, "redlock: extend healed nodes", "resource", i.Resource, "healed", i.Healed, "confirmed", i.Confirmed)
		}
		return
	}
	h.l.WarnContext(ctx, "redlock: extend failed", "resource", i.Resource, "renewal", i.Renewal, "confirmed", i.Confirmed,
		"quorum", i.Quorum, "err", i.Err)
}

func (h logHooks) Lost(ctx context.Context, i LostInfo) {
	h.l.ErrorContext(ctx, "redlock: lock lost", "resource", i.Resource, "held_for", i.HeldFor, "err", i.Err)
}

func (h logHooks) Release(ctx context.Context, i ReleaseInfo) {
	lvl := slog.LevelDebug
	if i.WasLost {
		lvl = slog.LevelWarn
	}
	h.l.Log(ctx, lvl, "redlock: release", "resource", i.Resource, "held_for", i.HeldFor,
		"was_lost", i.WasLost, "released", i.Released, "err", i.Err)
}

func (h logHooks) NodeError(ctx context.Context, i NodeErrorInfo) {
	h.l.WarnContext(ctx, "redlock: node error", "resource", i.Resource, "op", i.Op, "node", i.Node, "addr", i.Addr, "kind", i.Kind, "err", i.Err)
}

// observe returns what reports a Lock or TryLock call to cfg's hooks (not
// nil) when it returns; attempts is read then.
func (c *Client) observe(ctx context.Context, cfg config, callID uint64, resource string, attempts *int) func(*Lock, error) {
	obs := cfg.obs
	start := time.Now()
	return func(l *Lock, err error) {
		info := AcquireInfo{Call: callID, Resource: resource, Wait: time.Since(start), Attempts: *attempts,
			Outcome: outcomeOf(err), Fence: l.Fence(), Err: err}
		if l != nil {
			info.Lock, info.Local = l.id, *attempts == 0
		}
		obs.Acquire(ctx, info)
	}
}
