package redlockprom

import (
	"slices"
	"sync"
	"time"
)

const (
	// sameLock is how close two estimates of a lock's acquisition instant
	// must be to name the same lock. Both events compute HeldFor just before
	// calling the hook, so one lock's estimates differ by microseconds;
	// successive holders of one resource are at least a lock validity apart.
	sameLock = 25 * time.Millisecond
	// creditTTL is how long a release counted as expired waits for a Lost
	// of the same lock that may still be on its way (see ledger.released).
	creditTTL = 10 * time.Second
	// maxPending caps the lost locks remembered per resource that were never
	// released (a caller that neither unlocks a lost lock nor closes its
	// Client).
	maxPending = 64
)

// ledger pairs the events of one lock, so that each lock moves the
// expired counter and the held gauge once.
//
// The hooks name a lock by its resource only. Within a resource, a lock is
// told apart by its acquisition instant, estimated as (hook time − HeldFor):
// LostInfo and ReleaseInfo compute HeldFor from the same instant.
//
// Why pairing is needed (checked in the redlock code):
//   - A lost lock is reported by Lost once, and by Release with WasLost when
//     it is unlocked later: counting both would count it twice.
//   - Release reports WasLost also when the lock expired without a Lost:
//     Unlock stops the watchdog first, and when it runs after ValidUntil but
//     before the watchdog's deadline timer fired, no Lost ever comes. The
//     release must count then.
//   - Lost is called by the watchdog goroutine after it marked the lock
//     lost, so an Unlock on another goroutine may report the release first;
//     the Lost that follows must not count again.
//
// It is safe for concurrent use. The file is the same in prometheus/ and
// otel/ but for the package clause (.ci/run checks it): the two modules
// share no code but the core module's.
type ledger struct {
	now func() time.Time

	mu  sync.Mutex // protects res
	res map[string]*account
}

// account is what the ledger knows of one resource.
type account struct {
	held     int         // acquired − gone; -1 while a Lost precedes its Acquire
	lost     []time.Time // acquisition instants of locks lost and not yet released
	released []credit    // locks released as expired before any Lost of theirs
}

// credit is a lock counted as expired at its release.
type credit struct{ acquired, at time.Time }

func newLedger() *ledger {
	return &ledger{now: time.Now, res: make(map[string]*account)}
}

// acquired records a lock acquired on resource; it returns the change of
// the resource's held count.
func (l *ledger) acquired(resource string) (heldDelta int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.account(resource)
	before := a.held
	a.held++
	return l.settle(resource, a, before)
}

// lost records a Lost event. It returns the change of the held count and
// whether the lock is to be counted as expired (false when its release
// already counted it).
func (l *ledger) lost(resource string, heldFor time.Duration) (heldDelta int, expired bool) {
	now := l.now()
	acq := now.Add(-heldFor)
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.account(resource)
	before := a.held
	a.released = purge(a.released, now)
	if i := closest(len(a.released), func(i int) time.Time { return a.released[i].acquired }, acq); i >= 0 {
		a.released = slices.Delete(a.released, i, i+1)
		return l.settle(resource, a, before), false
	}
	a.held--
	if len(a.lost) == maxPending {
		a.lost = slices.Delete(a.lost, 0, 1)
	}
	a.lost = append(a.lost, acq)
	return l.settle(resource, a, before), true
}

// released records a Release event. It returns the change of the held
// count and whether the lock is to be counted as expired: when it was lost
// or expired and no Lost of it was seen.
func (l *ledger) released(resource string, heldFor time.Duration, wasLost bool) (heldDelta int, expired bool) {
	now := l.now()
	acq := now.Add(-heldFor)
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.account(resource)
	before := a.held
	a.released = purge(a.released, now)
	if wasLost {
		if i := closest(len(a.lost), func(i int) time.Time { return a.lost[i] }, acq); i >= 0 {
			a.lost = slices.Delete(a.lost, i, i+1)
			return l.settle(resource, a, before), false // counted by Lost
		}
		a.released = append(a.released, credit{acquired: acq, at: now})
		expired = true
	}
	// A release never takes the count below zero: a lock that Close
	// released while its Lock call was failing was never counted as held.
	if a.held > 0 {
		a.held--
	}
	return l.settle(resource, a, before), expired
}

func (l *ledger) account(resource string) *account {
	a := l.res[resource]
	if a == nil {
		a = &account{}
		l.res[resource] = a
	}
	return a
}

// settle drops an empty account and returns the change of the held count
// as exported: never below zero.
func (l *ledger) settle(resource string, a *account, before int) int {
	if a.held == 0 && len(a.lost) == 0 && len(a.released) == 0 {
		delete(l.res, resource)
	}
	return max(a.held, 0) - max(before, 0)
}

// closest returns the index of the instant (of n, read by at) nearest to
// acq and within sameLock of it, or -1.
func closest(n int, at func(int) time.Time, acq time.Time) int {
	best, bestD := -1, sameLock
	for i := range n {
		d := at(i).Sub(acq)
		if d < 0 {
			d = -d
		}
		if d <= bestD {
			best, bestD = i, d
		}
	}
	return best
}

// purge drops the credits older than creditTTL.
func purge(cs []credit, now time.Time) []credit {
	keep := cs[:0]
	for _, c := range cs {
		if now.Sub(c.at) < creditTTL {
			keep = append(keep, c)
		}
	}
	return keep
}
