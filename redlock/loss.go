package redlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/quorumlock/quorumlock/renew"
)

// expire declares the lock lost because its validity ran out, and returns
// the loss error.
func (l *Lock) expire(last error) error {
	err := l.expiredError(last)
	l.lose(err)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		return l.lostErr
	}
	return err
}

// expiredError is the loss of a lock whose validity ran out; last is what
// the last renewal round (or Extend) saw, if anything. It matches
// ErrLockLost and renew.ErrExpired.
func (l *Lock) expiredError(last error) error {
	msg := "redlock: lock lost: its validity ran out before a renewal succeeded"
	if !l.cfg.autoRenew {
		msg = "redlock: lock lost: its lease ran out at ValidUntil (a fixed lease, WithAutoRenew(false): Extend it in time, or let it renew)"
	}
	return &classed{msg: msg, class: []error{ErrLockLost, renew.ErrExpired}, cause: last}
}

// lose declares the lock lost, once (DESIGN step 7). The signal comes
// first: Context() is cancelled with err and Lost() closed, and renewal
// stopped, here and now. The Lost hook and then OnLost run after, on a
// goroutine the Client owns (one per lost lock), so no hook delays this
// lock's signal or any other's. It never blocks, so the scheduler may call
// it. A lock Lock never returned (see Valid) is lost without hooks: the
// caller never saw it.
func (l *Lock) lose(err error) {
	if !errors.Is(err, ErrLockLost) {
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return
	}
	l.state, l.lostErr = stateLost, err
	h, returned, cur := l.handle, l.returned, l.cur // the lease's loss is its holder's
	// WithMaxHold's cap (maxhold.go) ends with the lock.
	if l.capTimer != nil {
		l.capTimer.Stop()
	}
	l.mu.Unlock()
	// Cancel before closing Lost, so that a reader woken by Lost already
	// sees the cause on Context.
	cur.cancel(err)
	close(cur.lost)
	if h != nil {
		h.Cancel()
	}
	l.c.cohortFree(l.lease) // the next Lock call of the line contends (cohort.go)
	if !returned {
		close(cur.lostDone)
		return
	}
	l.c.lossCallbacks(cur, err, time.Since(cur.acquired))
}

// reportExpiry declares the loss of a lock whose validity has run out
// although the deadline timer has not fired yet, so that every lock that
// expired before its release is reported lost exactly once, before the
// release.
func (l *Lock) reportExpiry() {
	l.mu.Lock()
	expired := l.state == stateHeld && !time.Now().Before(l.validUntil)
	l.mu.Unlock()
	if expired {
		_ = l.expire(nil)
	}
}
