package election

import (
	"context"
	"log/slog"
	"time"
)

// Hooks observe leadership changes of the candidates of an Election, for
// logs and metrics. It is separate from redlock.Hooks, so that existing
// implementations of those keep compiling; the adapters in the nested
// modules prometheus/ and otel/ implement both.
//
// Leadership is called synchronously on the goroutine that saw the change
// (a Campaign, a Resign, or the term's own goroutine for a loss), never
// while the election holds a mutex. It must be safe for concurrent use,
// return quickly and never block.
type Hooks interface {
	Leadership(ctx context.Context, info LeadershipInfo)
}

// Event is a leadership change.
type Event string

// The events.
const (
	EventAcquired Event = "acquired" // a Campaign won; the term began
	EventLost     Event = "lost"     // the term ended because the lease could not be kept
	EventResigned Event = "resigned" // the term ended by Resign (or by Close of the redlock Client)
)

// LeadershipInfo describes one leadership change of this process.
type LeadershipInfo struct {
	Election string // the election's name
	Identity string // this candidate's identity
	Event    Event
	Fence    int64         // the term's fencing token (0 without redlock.WithFencing)
	Wait     time.Duration // acquired: how long the Campaign call took
	Held     time.Duration // lost, resigned: how long the term lasted
	Err      error         // lost: why (matches redlock.ErrLockLost); resigned by Close: redlock.ErrClosed
}

// report calls the hooks and the logger, if any.
func (e *Election) report(ctx context.Context, info LeadershipInfo) {
	if h := e.cfg.hooks; h != nil {
		h.Leadership(ctx, info)
	}
	l := e.cfg.logger
	if l == nil {
		return
	}
	attrs := []any{"election", info.Election, "identity", info.Identity, "fence", info.Fence}
	switch info.Event {
	case EventAcquired:
		l.InfoContext(ctx, "election: leadership acquired", append(attrs, "wait", info.Wait)...)
	case EventResigned:
		l.InfoContext(ctx, "election: leadership resigned", append(attrs, "held", info.Held, "err", info.Err)...)
	case EventLost:
		l.ErrorContext(ctx, "election: leadership lost", append(attrs, "held", info.Held, "err", info.Err)...)
	}
}

// warn logs a failure that changes no leadership (a node that refused an
// identity write or an announcement).
func (e *Election) warn(ctx context.Context, msg string, err error) {
	if l := e.cfg.logger; l != nil {
		l.Log(ctx, slog.LevelWarn, "election: "+msg, "election", e.name, "err", err)
	}
}
