package redlock

import (
	"context"
	"fmt"
	"slices"
)

// A call never waits for itself (DESIGN, rules of the contract). Go has no
// goroutine identity, so a Client cannot tell the goroutine that holds a
// lock from another goroutine of the process that wants it: the second
// must wait (its Lock is served when the first unlocks), the first would
// wait for ever. What does tell them apart is the ctx: a Lock's Context,
// and Do's fn ctx, carry the lock (holderKey), and so does every ctx
// derived from them. A Lock, TryLock, RLock, WLock or LockAll call whose
// ctx carries a lock of this Client that is still held on an overlapping
// resource is the holder locking again: it returns ErrAlreadyHeld at once,
// with no I/O. Readers too: a reader's RLock of the resource it reads is
// not let through, since a writer that began waiting before it goes first
// (rw.lua) and that writer waits for our reader — recursive read locking
// deadlocks, as it does with sync.RWMutex. A ctx that does not come from the lock (context.Background(),
// a request's ctx) is another caller, and waits its turn.

// holderKey is the ctx key under which a Lock's Context carries the lock
// (context.WithValue(ctx, holderKey{}, l)).
type holderKey struct{}

// heldBy returns the locks ctx carries that are still held: a lock
// acquired on ctx records them as its outer. Only held ones are kept, so
// the list stays as long as the locks held at once, also under
// hand-over-hand locking, where each lock's ctx comes from the previous,
// released one (it grew by one lock per acquisition before).
func heldBy(ctx context.Context) []*Lock {
	h, _ := ctx.Value(holderKey{}).(*Lock) // the innermost; the others it carried are in its outer
	if h == nil {
		return nil
	}
	var out []*Lock
	for _, l := range append([]*Lock{h}, h.outer...) {
		if l.holds() {
			out = append(out, l)
		}
	}
	return out
}

// holds reports whether l holds its lease now: held, and not passed on.
func (l *Lock) holds() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur == l && l.state == stateHeld
}

// callerHolds returns an error matching ErrAlreadyHeld when ctx carries a
// lock of c, still held, that a call of kind cfg.mode on resource would
// wait for: the call would wait for itself.
func (c *Client) callerHolds(ctx context.Context, resource string, cfg config) error {
	for _, h := range heldBy(ctx) {
		if h.c != c {
			continue
		}
		for _, r := range h.Resources() {
			if cfg.mode == ModeMulti && slices.Contains(cfg.resources, r) || cfg.mode != ModeMulti && r == resource {
				return alreadyHeld(fmt.Sprintf("%q: ctx comes from this Client's %v lock on %q, still held", resource, h.cfg.mode, r))
			}
		}
	}
	return nil
}

// alreadyHeld is the error of a call that would wait for the caller's own
// lock: it matches ErrAlreadyHeld and ErrNotObtained.
func alreadyHeld(detail string) error {
	return &classed{msg: "redlock: not obtained: the caller holds the lock already (locks are not reentrant: pass the *Lock, or Unlock it first): " + detail,
		class: []error{ErrNotObtained, ErrAlreadyHeld}}
}
