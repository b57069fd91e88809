package redlock

import (
	"crypto/tls"
	"log/slog"
	"time"
)

// Defaults. Durations derived from the TTL (renew interval, node timeout) are
// computed from the effective TTL of each lock, after per-call options.
const (
	DefaultTTL           = 30 * time.Second       // lease per acquire and renewal
	DefaultRetryDelayMin = 50 * time.Millisecond  // fallback delay between attempts, lower bound
	DefaultRetryDelayMax = 250 * time.Millisecond // fallback delay between attempts, upper bound
	DefaultDriftFactor   = 0.01                   // share of the TTL given up to clock drift (plus 2ms)
	DefaultKeyPrefix     = "lock:"                // prefix of every lock key
	MaxNodeTimeout       = time.Second            // cap of the derived node timeout (TTL/10)
	// DefaultLocalHandoffs is how many times a lease is passed between
	// goroutines of one Client before it goes back through the nodes.
	DefaultLocalHandoffs = 16
	// DefaultLocalHandoffTime is how long after it was taken on the nodes
	// a lease may still be passed between goroutines of one Client.
	DefaultLocalHandoffTime = 10 * time.Millisecond
)

// Option configures a Client (defaults for every lock) or one Lock, TryLock
// or Do call (that lock only). Per-call options never change the Client.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTTL sets the lease taken by each acquire and each renewal. The default
// is 30s ([DefaultTTL]). The renew interval (TTL/3) and the node timeout
// (TTL/10, at most 1s) follow it unless set explicitly.
func WithTTL(ttl time.Duration) Option {
	return optionFunc(func(c *config) { c.ttl = ttl })
}

// WithAutoRenew turns the watchdog on or off. It is on by default: the lease
// is extended on every node each renew interval while the lock is held. Off,
// the lock is a fixed lease that is lost at its ValidUntil unless Extend is
// called.
func WithAutoRenew(on bool) Option {
	return optionFunc(func(c *config) { c.autoRenew = on })
}

// WithRenewInterval sets the time between the starts of two renewals. The
// default is TTL/3. It must be longer than the node timeout, and the
// interval plus the node timeout must be shorter than the TTL minus the
// drift allowance (TTL·drift + 2ms), or no renewal could be decided before
// the lock's validity ends: New, Lock, TryLock and Do refuse it with
// ErrInvalidArgument. The last rule holds only with auto-renewal (a fixed
// lease is never renewed).
func WithRenewInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.renewInterval, c.renewSet = d, true })
}

// WithRetryCount sets the total number of attempts Lock makes (like
// aioredlock's retry_count). 0, the default, means until ctx is done; a
// negative count is invalid. TryLock always makes one attempt.
func WithRetryCount(n int) Option {
	return optionFunc(func(c *config) { c.retryCount = n })
}

// WithRetryDelay sets the range of the jittered delay between two attempts
// of Lock: each delay is drawn uniformly from [min, max). The default is
// 50ms to 250ms. It needs 0 ≤ min ≤ max.
func WithRetryDelay(min, max time.Duration) Option {
	return optionFunc(func(c *config) { c.retryMin, c.retryMax = min, max })
}

// WithDriftFactor sets the share of the TTL given up to clock drift between
// the client and the nodes; 2ms are added to it, as in the Redlock
// specification. The default is 0.01. It must be in [0, 1).
func WithDriftFactor(f float64) Option {
	return optionFunc(func(c *config) { c.drift = f })
}

// WithNodeTimeout sets how long one request to one node may take before that
// node counts as failed. The default is TTL/10, at most 1s. It must be
// positive and shorter than the renew interval, and leave room for a
// renewal (see WithRenewInterval).
func WithNodeTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.nodeTimeout, c.timeoutSet = d, true })
}

// WithKeyPrefix sets the prefix of every lock key: resource "invoice:1234"
// is key "lock:invoice:1234" with the default "lock:". It is valid for New
// only: per call it would hide the key from IsLocked.
func WithKeyPrefix(p string) Option {
	return optionFunc(func(c *config) { c.keyPrefix, c.keyPrefixSet = p, true })
}

// WithFencing turns on fencing tokens: Lock.Fence returns a number that
// strictly increases across successive holders of a resource. Off by default.
func WithFencing(on bool) Option {
	return optionFunc(func(c *config) { c.fencing = on })
}

// WithWakeUp turns the waiter queue on or off (DESIGN step 9). On by
// default: a Lock call that finds the lock held subscribes its Client's
// channel on every node (once per Client, one connection per node shared
// by all its waiters) and joins the resource's queue on the nodes with its
// ticket. A release then hands the key to the first live waiter in the
// order (ticket, member) for a short reservation (two node timeouts, or
// two retry delays and a node timeout when that is more, at most TTL/2:
// 2s at the defaults), tells that waiter's Client alone, and the waiter's
// first renewal extends the key to its TTL; the retry delay is only a
// fallback for a lost message. A frozen or cut-off grantee so delays the
// next waiter by one reservation at most. Tickets are the Lock call's start
// on its host's wall clock: "in order" assumes the hosts' clocks agree, and
// a host whose clock lags by Δ goes ahead of calls that started within Δ.
//
// Off, Lock polls with the retry delay and never queues. A caller outside
// the queue (WithWakeUp(false), TryLock, another library's client on the
// key) is served only when the key is free and no live waiter is queued: under
// sustained queued contention its share is near zero (benchmarks
// TestMixedCallersShares). In a rolling migration from redsync, turn it
// off on every quorumlock Client until the last redsync process is gone
// (docs/migrating-from-redsync.md).
func WithWakeUp(on bool) Option {
	return optionFunc(func(c *config) { c.wakeUp = on })
}

// WithLocalHandoff bounds the local handoff: a lock passed by Unlock to
// another goroutine of this Client waiting in Lock for the same resource,
// without a round trip (lock cohorting; the new holder's Lock returns a new
// *Lock over the same lease, and the old *Lock is unlocked at once). A
// lease is passed on at most n times, and only within d of when it was
// taken on the nodes; then Unlock releases it on the nodes, where waiters
// of other Clients are served in their order. So a waiter of another Client
// queued on the nodes waits for this Client's lease at most d plus the
// hold of the goroutine that holds it when d runs out (and a release round
// trip). Every Lock call has a bound too: with I Clients of at most G
// calls each in line for the resource, a call waits at most G × I leases,
// each at most d plus one hold plus one release and grant through the
// nodes (docs/fairness.md; TestCohort_everyCallWithinItsBound). The defaults are 16 ([DefaultLocalHandoffs]) and 10ms
// ([DefaultLocalHandoffTime]); n = 0 turns local handoff off. It needs
// n ≥ 0, d ≥ 0, and d > 0 when n > 0.
//
// Only plain exclusive locks are passed on: Lock and Do calls with no
// per-call option, on a Client without WithFencing (a fence is taken on
// the nodes), without WithMaxHold and without WithRetryCount. Read-write locks, multi-locks,
// semaphores, election terms, TryLock and Resume never hand off locally.
func WithLocalHandoff(n int, d time.Duration) Option {
	return optionFunc(func(c *config) { c.localMax, c.localFor = n, d })
}

// WithOnLost sets a function called once when the lock is lost, with an
// error matching ErrLockLost that says how many nodes confirmed and why the
// rest failed. It runs after the loss is signalled (Lost() closed,
// Context() cancelled) and after the Lost hook, on a goroutine the Client
// owns, one per lost lock, outside any lock of the library, so it may call
// Unlock or Close, and a slow one delays no other lock. Close waits for it
// (a Close called from it does not wait for itself). It is not called for
// a lock unlocked in time, nor after Close, nor for a lock Lock never
// returned; an Unlock that comes after ValidUntil reports the loss that
// already happened, and so calls it.
func WithOnLost(fn func(l *Lock, err error)) Option {
	return optionFunc(func(c *config) { c.onLost = fn })
}

// DefaultRenewBatch is how many renewals due together go to a node in one
// pipeline, by default.
const DefaultRenewBatch = 256

// WithRenewBatch sets how many renewals that fall due together are sent to
// each node in one pipeline (one round trip per node for all of them);
// quorum decisions and loss stay per lock. The default is 256
// ([DefaultRenewBatch]); 0 or 1 renews each lock with its own round. Valid
// for New only.
func WithRenewBatch(n int) Option {
	return optionFunc(func(c *config) { c.renewBatch, c.renewBatchSet = n, true })
}

// WithTLSConfig sets the TLS configuration of the clients Dial builds for
// TLS URLs (rediss, rediss+sentinel, rediss+cluster): the roots to trust
// (RootCAs) and a client certificate for mutual TLS (Certificates). Dial uses
// a clone, with ServerName set to the URL's host when empty, and
// InsecureSkipVerify when the URL says skip_verify=true. URLs without TLS
// ignore it. It has no effect on New or on a single call, which build no
// clients. By default TLS URLs trust the system's roots.
func WithTLSConfig(cfg *tls.Config) Option { return tlsOption{cfg} }

// WithRestartGuard protects locks held by others from a node that restarted
// and lost its keys: while a node may have been up for less than maxTTL it
// grants nothing, and its refusal is a *NodeError matching ErrNodeRestarted
// (so a majority that needs it fails with ErrNoQuorum, and Lock retries).
// Without it, a lock held on exactly a majority can be granted again to a
// second client through the restarted node while the first still holds it:
// the hazard the Redlock specification answers with "delayed restarts",
// which this enforces from the client side. Off (0) by default.
//
// maxTTL must be at least the longest TTL that any client uses on the
// resources locked through this Client (the guard cannot know other
// processes' TTLs), and at least this lock's TTL. Nodes report their uptime
// in whole seconds, which may exceed the real uptime by up to a second, so
// maxTTL is rounded up to whole seconds and the reported uptime must exceed
// it. Given per call, it applies to that call only.
//
// Only acquisitions are guarded. Extend and the watchdog still set our key
// again on a restarted node (heal it): our lease was held without a break,
// and the guard kept others from taking that node meanwhile. The uptime is
// read with INFO inside the acquire script, in the same atomic step as the
// grant, so the node's ACL needs +info, and the node must be Redis ≥ 5
// (miniredis has no INFO). A Sentinel failover does not reset uptime: a
// promoted replica that missed the key has been up for long. Nodes that keep
// their data across restarts (appendonly with appendfsync always) need no
// guard. See docs/nodes.md.
func WithRestartGuard(maxTTL time.Duration) Option {
	return optionFunc(func(c *config) { c.restartGuard = maxTTL })
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
