package redlock

import (
	"context"
	"errors"
	"time"
)

// Do acquires the lock on resource (as Lock does, with opts), runs fn, and
// releases the lock afterwards. fn's ctx is cancelled when the caller's ctx
// ends or the lock is lost (then context.Cause matches ErrLockLost). The
// release runs on a context without the caller's cancellation, bounded by the
// node timeout.
//
// Do returns fn's error. If the lock was lost before fn returned, the error
// matches ErrLockLost (joined with fn's error). If the lock could not be
// acquired, fn is not called and Do returns Lock's error. A failed release of
// a lock that was not lost is joined to fn's error.
func (c *Client) Do(ctx context.Context, resource string, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return invalid("fn must not be nil")
	}
	l, err := c.Lock(ctx, resource, opts...)
	if err != nil {
		return err
	}
	return runHeld(ctx, l, fn)
}

// runHeld runs fn under l and releases l afterwards: the rest of Do, shared
// with Semaphore.Do.
func runHeld(ctx context.Context, l *Lock, fn func(ctx context.Context) error) error {
	fctx, cancel := context.WithCancelCause(context.WithValue(ctx, holderKey{}, l)) // fn locking l's resource again would wait for itself (reentry.go)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	ferr := fn(fctx)
	stop()
	cancel(nil)

	lostErr := l.lossBefore()
	uerr := l.Unlock(ctx)
	switch {
	case lostErr != nil:
		return errors.Join(lostErr, ferr)
	case uerr != nil:
		return errors.Join(ferr, uerr)
	}
	return ferr
}

// lossBefore returns the loss error if the lock is lost or its validity has
// run out by now (the deadline timer may not have fired yet).
func (l *Lock) lossBefore() error {
	l.mu.Lock()
	st, until, lostErr := l.state, l.validUntil, l.lostErr
	l.mu.Unlock()
	switch {
	case st == stateLost:
		return lostErr
	case st == stateHeld && !time.Now().Before(until):
		return l.expire(nil)
	}
	return nil
}
