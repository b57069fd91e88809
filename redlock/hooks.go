package redlock

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hooks observe what a Client's locks do, for logs, metrics and traces. The
// adapters in the nested modules otel/ and prometheus/ implement it.
// Embed NoHooks to implement only some methods.
//
// Methods are called synchronously on the goroutine doing the work (a Lock
// call, a renewal, an Unlock), never while the library holds a mutex. They
// must be safe for concurrent use, return quickly and never block: a slow
// hook delays acquisitions and renewals. Tokens are never passed to hooks.
type Hooks interface {
	// Attempt is called after each acquisition round on the nodes.
	Attempt(AttemptInfo)
	// Acquire is called when a Lock or TryLock call ends, acquired or not.
	Acquire(AcquireInfo)
	// Extend is called after each extension round: a renewal, or Extend.
	Extend(ExtendInfo)
	// Lost is called once when a lock is lost (before OnLost runs).
	Lost(LostInfo)
	// Release is called when Unlock or Close has released a lock.
	Release(ReleaseInfo)
	// NodeError is called for every request to a node that failed.
	NodeError(NodeErrorInfo)
}

// NoHooks implements Hooks with methods that do nothing; embed it.
type NoHooks struct{}

func (NoHooks) Attempt(AttemptInfo)     {}
func (NoHooks) Acquire(AcquireInfo)     {}
func (NoHooks) Extend(ExtendInfo)       {}
func (NoHooks) Lost(LostInfo)           {}
func (NoHooks) Release(ReleaseInfo)     {}
func (NoHooks) NodeError(NodeErrorInfo) {}

// Outcome is how an acquisition attempt or call ended.
type Outcome string

// The outcomes.
const (
	OutcomeAcquired    Outcome = "acquired"
	OutcomeNotObtained Outcome = "not_obtained" // another owner holds it
	OutcomeNoQuorum    Outcome = "no_quorum"    // too few nodes answered
	OutcomeCanceled    Outcome = "canceled"     // ctx ended
	OutcomeClosed      Outcome = "closed"       // the Client was closed
	OutcomeError       Outcome = "error"        // anything else, e.g. bad input
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
	case errors.Is(err, ErrNotObtained):
		return OutcomeNotObtained
	case errors.Is(err, ErrNoQuorum):
		return OutcomeNoQuorum
	}
	return OutcomeError
}

// AttemptInfo describes one acquisition round.
type AttemptInfo struct {
	Resource string
	Latency  time.Duration // from the first request to the decision (both phases with fencing)
	Granted  int           // nodes that granted; Granted − Quorum is the quorum margin
	Quorum   int           // nodes needed
	Nodes    int
	Outcome  Outcome
	Err      error
}

// AcquireInfo describes a whole Lock or TryLock call.
type AcquireInfo struct {
	Resource string
	Wait     time.Duration // from the call to its return
	Attempts int
	Outcome  Outcome
	Fence    int64 // with WithFencing, the lock's token
	Err      error
}

// ExtendInfo describes one extension round.
type ExtendInfo struct {
	Resource  string
	Renewal   bool          // by the watchdog (false: an Extend call)
	Lag       time.Duration // renewals: from when the renewal was due to its confirmation
	Latency   time.Duration // the round itself
	Confirmed int           // nodes where the key is ours now; Confirmed − Quorum is the margin
	Healed    int           // of which the key had to be set again (the node had lost it)
	Quorum    int
	Nodes     int
	Err       error // nil on success; matches ErrLockLost when the round lost the lock
}

// LostInfo describes a lost lock.
type LostInfo struct {
	Resource string
	HeldFor  time.Duration
	Err      error // matches ErrLockLost; says why
}

// ReleaseInfo describes the release of a lock by Unlock or Close.
type ReleaseInfo struct {
	Resource string
	HeldFor  time.Duration // from acquisition to release
	WasLost  bool          // the lock was lost or had expired before this release: the TTL was too short or the process paused
	Released int           // nodes where our key was deleted
	Err      error
}

// NodeErrorInfo describes one failed request to one node.
type NodeErrorInfo struct {
	Resource string
	Op       string // "acquire", "commit", "extend", "release", "exists"
	Node     int
	Addr     string
	Kind     string // "timeout", "canceled", "connection", "reply" (an error reply such as WRONGTYPE or NOPERM), "busy"
	Err      error
}

func errorKind(err error) string {
	var ne net.Error
	var re redis.Error
	switch {
	case errors.Is(err, errBusy):
		return "busy"
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

// WithHooks sets the hooks that observe locks. None by default.
func WithHooks(h Hooks) Option {
	return optionFunc(func(c *config) { c.hooks = h })
}

// WithLogger logs what locks do to l: acquisitions and releases at Debug,
// failed renewals and node errors at Warn, lost locks at Error. Tokens are
// never logged. None by default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// observer returns the hooks to call, or nil when there are none.
func (c *config) observer() Hooks {
	switch {
	case c.logger == nil:
		return c.hooks
	case c.hooks == nil:
		return logHooks{c.logger}
	}
	return multiHooks{c.hooks, logHooks{c.logger}}
}

type multiHooks []Hooks

func (m multiHooks) Attempt(i AttemptInfo) {
	for _, h := range m {
		h.Attempt(i)
	}
}
func (m multiHooks) Acquire(i AcquireInfo) {
	for _, h := range m {
		h.Acquire(i)
	}
}
func (m multiHooks) Extend(i ExtendInfo) {
	for _, h := range m {
		h.Extend(i)
	}
}
func (m multiHooks) Lost(i LostInfo) {
	for _, h := range m {
		h.Lost(i)
	}
}
func (m multiHooks) Release(i ReleaseInfo) {
	for _, h := range m {
		h.Release(i)
	}
}
func (m multiHooks) NodeError(i NodeErrorInfo) {
	for _, h := range m {
		h.NodeError(i)
	}
}

// logHooks writes structured logs.
type logHooks struct{ l *slog.Logger }

func (h logHooks) Attempt(AttemptInfo) {}

func (h logHooks) Acquire(i AcquireInfo) {
	lvl := slog.LevelDebug
	if i.Outcome != OutcomeAcquired && i.Outcome != OutcomeNotObtained && i.Outcome != OutcomeCanceled {
		lvl = slog.LevelWarn
	}
	h.l.Log(context.Background(), lvl, "redlock: acquire", "resource", i.Resource, "outcome", string(i.Outcome),
		"wait", i.Wait, "attempts", i.Attempts, "fence", i.Fence, "err", i.Err)
}

func (h logHooks) Extend(i ExtendInfo) {
	if i.Err == nil {
		if i.Healed > 0 {
			h.l.Info("redlock: extend healed nodes", "resource", i.Resource, "healed", i.Healed, "confirmed", i.Confirmed)
		}
		return
	}
	h.l.Warn("redlock: extend failed", "resource", i.Resource, "renewal", i.Renewal, "confirmed", i.Confirmed,
		"quorum", i.Quorum, "err", i.Err)
}

func (h logHooks) Lost(i LostInfo) {
	h.l.Error("redlock: lock lost", "resource", i.Resource, "held_for", i.HeldFor, "err", i.Err)
}

func (h logHooks) Release(i ReleaseInfo) {
	lvl := slog.LevelDebug
	if i.WasLost {
		lvl = slog.LevelWarn
	}
	h.l.Log(context.Background(), lvl, "redlock: release", "resource", i.Resource, "held_for", i.HeldFor,
		"was_lost", i.WasLost, "released", i.Released, "err", i.Err)
}

func (h logHooks) NodeError(i NodeErrorInfo) {
	h.l.Warn("redlock: node error", "resource", i.Resource, "op", i.Op, "node", i.Node, "addr", i.Addr, "kind", i.Kind, "err", i.Err)
}
