package redlock

import (
	"fmt"
	"time"
)

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
