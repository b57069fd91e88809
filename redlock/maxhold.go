package redlock

import (
	"errors"
	"fmt"
	"time"
)

// ErrMaxHold is the cause of a lock's loss when it reached its WithMaxHold
// cap: the error matches both ErrMaxHold and ErrLockLost.
var ErrMaxHold = errors.New("redlock: max hold reached")

// WithMaxHold caps how long a lock is held: d after Lock returned it (or
// Resume took it over), auto-renewal stops and the lock is lost at once —
// Lost() closed, Context() cancelled and OnLost called with an error that
// matches ErrMaxHold and ErrLockLost — so that a holder that forgot its
// lock (a hung worker, a leaked goroutine) cannot keep it renewed forever.
// The keys are not deleted then: they expire within a TTL of the last
// renewal (Unlock deletes them at once), so no other client can take the
// lock before the holder was told. Extend after the cap returns the loss.
// The default is 0: no cap. A negative d is invalid.
func WithMaxHold(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxHold = d })
}

// armMaxHold starts the timer of the WithMaxHold cap (l.cfg.maxHold > 0),
// counted from the hold's start. It runs in watch, once the lock is sure to
// be returned.
func (l *Lock) armMaxHold() {
	d := l.cfg.maxHold
	err := &classed{
		msg:   fmt.Sprintf("redlock: lock lost: held for its WithMaxHold cap of %v; auto-renewal stopped", d),
		class: []error{ErrLockLost, ErrMaxHold},
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateHeld {
		return
	}
	// The timer's function runs on its own goroutine once it fires, and
	// lose never blocks (the hooks run on the Client's goroutines).
	l.capTimer = time.AfterFunc(d-time.Since(l.acquired), func() { l.lose(err) })
}

// stopMaxHold stops the cap's timer. l.mu is held.
func (l *Lock) stopMaxHold() {
	if l.capTimer != nil {
		l.capTimer.Stop()
	}
}
