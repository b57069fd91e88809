// Package testhooks holds switches that break the library on purpose, for
// the negative controls of tests in other packages (the chaos checker must
// catch a library that skips a safety step). Production code reads them;
// nothing but tests sets them.
package testhooks

import (
	"sync/atomic"
	"time"
)

// SkipReleaseGuard makes releases leave no guard key: a request of ours
// that lands after the release can then set the key again.
var SkipReleaseGuard atomic.Bool

// ExtendPause, when set, is called by an extension of a held lock after it
// was registered and before its requests are sent: a test holds it there
// to race an Unlock against it.
var ExtendPause atomic.Pointer[func()]

// BeforeExtendSend runs ExtendPause, if set.
func BeforeExtendSend() {
	if f := ExtendPause.Load(); f != nil {
		(*f)()
	}
}

// ResumeRead, when set, is called by Resume with its resource once its
// read round is decided, before its re-arm round is sent: a test deletes
// the key there to play a lock that expires between the two rounds.
var ResumeRead atomic.Pointer[func(resource string)]

// AfterHold, when set, is called by redlock with the resource of every
// lock granted, after it is held and before Lock makes its last validity
// check: a test pauses there to play a process starved between the grant
// and the return.
var AfterHold atomic.Pointer[func(resource string)]

// SkipNotAfter makes acquires and extends carry no not-after bound, while
// the release guard stays as short as the bounds allow: a request of ours
// held on a node past its deadline can then set the key again after the
// guard expired.
var SkipNotAfter atomic.Bool

// ReaderIgnoresWriter makes read locks use a reader script that grants
// beside a writer's token in the lock key (it leaves the key alone): a
// reader and a writer then hold together, which the chaos checker's
// rwlock profile must catch (issue 24).
var ReaderIgnoresWriter atomic.Bool

// ExtendRegisterLate makes an extension register its round after it has
// sent its requests, not before (the order before issue 20's fix): an
// Unlock in between finds no round pending, leaves no guard, and the
// extension landing after the release sets the key again.
var ExtendRegisterLate atomic.Bool

// QueueTieKeeps makes a yielding waiter keep its nodes when its ticket
// equals the head's, whatever the members (the queue's rule before issue
// 20: equal tickets kept their minorities and livelocked).
var QueueTieKeeps atomic.Bool

// HandoffFullTTL makes a waiter's queue entry name the full TTL instead of
// the short reservation (the handoff before issue 20): a frozen grantee
// then holds the next waiter up for a whole TTL.
var HandoffFullTTL atomic.Bool

// SemaphoreSkipsPermits makes a Semaphore's acquire lock a resource of
// its own (its permit's name and a random suffix) instead of one of the K
// permits: no permit is ever found held, so every caller holds at once,
// which the simulator's semaphore profile must catch (issue 24).
var SemaphoreSkipsPermits atomic.Bool

// TermIgnoresLoss makes an election Term forget its lease: its Context is
// cancelled by Resign or Close but not when the lease is lost, and its
// ValidUntil lies an hour ahead while that Context lives. A deposed leader
// then goes on leading beside its successor, which the simulator's
// election profile must catch (leader-overlap).
var TermIgnoresLoss atomic.Bool

// ObserveSeesFirst makes Election.Observe read the leader once and ignore
// every announcement and poll after it: an observer then never learns of a
// new term, which the simulator's election profile must catch
// (observe-liveness).
var ObserveSeesFirst atomic.Bool

// DetachSkipsWait makes Detach hand a lock over without waiting out its
// requests still in flight (Detach before issue 30): an extension of the
// detached lock that lands after the next owner's release sets the key
// again, which the simulator's key-back check must catch.
var DetachSkipsWait atomic.Bool

// YieldUnbounded makes a yield carry no not-after bound (yields before
// issue 30): a yield held in the network until the release's guard is gone
// queues a finished token again.
var YieldUnbounded atomic.Bool

// DeadlineUnwatched makes the renewal scheduler ignore a lock's deadline:
// it neither wakes for it nor declares the lock lost when ValidUntil
// passes (renewals go on). Alone it leaves the loss to the extension's own
// checks (a round decided at or after ValidUntil loses the lock); with
// those mutated it is the pairwise control of layered safeguards (issue
// 33, internal/sim/mutate).
var DeadlineUnwatched atomic.Bool

// ReleasePause, when set, is called with the lock key and the node by
// every release of a lock to one node (the retry loop's too), on its
// goroutine, before it is sent: a test holds it there to play a release
// that runs late.
var ReleasePause atomic.Pointer[func(key string, node int)]

// BeforeReleaseSend runs ReleasePause, if set.
func BeforeReleaseSend(key string, node int) {
	if f := ReleasePause.Load(); f != nil {
		(*f)(key, node)
	}
}

// AcquirePause, when set, is called with the lock key and the node by
// every acquire request of a lock to one node, on its goroutine, before
// it does anything: a test holds it there to play a request goroutine
// that starts late (descheduled on a busy machine). Read in place
// (redlock/acquire.go), so that the TryLock path does not pass through
// this file.
var AcquirePause atomic.Pointer[func(key string, node int)]

// AbandonSkipsRelease makes a failed or cancelled attempt's cleanup send
// no release: a grant it got stays on its nodes until its TTL, which the
// simulator's residue check must catch (left-behind, issue 42).
var AbandonSkipsRelease atomic.Bool

// AbandonNodes returns n, or 0 under AbandonSkipsRelease: the nodes a
// failed attempt's cleanup releases.
func AbandonNodes(n int) int {
	if AbandonSkipsRelease.Load() {
		return 0
	}
	return n
}

// CloseKeepsIdentity makes Close leave its identity keys (internal/node's
// node check) on the nodes for their hour, which the simulator's residue
// check must catch (close-left, issue 42).
var CloseKeepsIdentity atomic.Bool

// LapseTenfold makes a waiter's queue entry lapse ten times later than its
// stated life (redlock's queueLife), which the simulator's residue check
// must catch (expiry-bound, issue 42).
var LapseTenfold atomic.Bool

// Lapse returns d, or ten times d under LapseTenfold.
func Lapse(d time.Duration) time.Duration {
	if LapseTenfold.Load() {
		return 10 * d
	}
	return d
}

// LeaderSeesNone makes Election.Leader answer ErrNoLeader even when a
// majority holds one identity: an observer then never learns who leads
// while a term holds, which the simulator's election profile must catch
// (leader-current, issue 42).
var LeaderSeesNone atomic.Bool

// FirstRenewalLate makes a lock held from handoffs renew first at the end
// of its validity instead of before its reservations expire: such a lock
// held past them is lost with nothing wrong, which the simulator's
// spurious-loss must catch (issue 42).
var FirstRenewalLate atomic.Bool

// FirstRenewal returns first, or the time until until under
// FirstRenewalLate.
func FirstRenewal(first time.Duration, until time.Time) time.Duration {
	if FirstRenewalLate.Load() {
		return max(time.Until(until), time.Millisecond)
	}
	return first
}
