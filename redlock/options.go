package redlock

import (
	"log/slog"
	"time"

	"github.com/quorumlock/quorumlock/quorum"
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
)

// Option configures a Client (defaults for every lock) or one Lock, TryLock
// or Do call (that lock only). Per-call options never change the Client.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	ttl           time.Duration
	autoRenew     bool
	renewInterval time.Duration // 0: derived, TTL/3
	nodeTimeout   time.Duration // 0: derived, min(TTL/10, 1s)
	retryCount    int
	retryMin      time.Duration
	retryMax      time.Duration
	drift         float64
	keyPrefix     string
	keyPrefixSet  bool // WithKeyPrefix was given (invalid per call)
	fencing       bool
	wakeUp        bool
	onLost        func(*Lock, error)
	hooks         Hooks
	logger        *slog.Logger
	obs           Hooks // hooks and logger together; set by buildConfig
	renewBatch    int
	renewBatchSet bool          // WithRenewBatch was given (invalid per call)
	restartGuard  time.Duration // 0: off; see WithRestartGuard (guard.go)
}

func defaultConfig() config {
	return config{
		ttl:        DefaultTTL,
		autoRenew:  true,
		wakeUp:     true,
		retryMin:   DefaultRetryDelayMin,
		retryMax:   DefaultRetryDelayMax,
		drift:      DefaultDriftFactor,
		keyPrefix:  DefaultKeyPrefix,
		renewBatch: DefaultRenewBatch,
	}
}

// buildConfig applies opts over base. A nil option is ignored.
func buildConfig(base config, opts []Option) config {
	c := base
	c.keyPrefixSet, c.renewBatchSet = false, false
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	c.obs = c.observer()
	return c
}

// interval returns the effective renew interval.
func (c *config) interval() time.Duration {
	if c.renewInterval != 0 {
		return c.renewInterval
	}
	return c.ttl / 3
}

// reservation is how long a release hands the key to the first waiter
// before that waiter confirms it (step 9): long enough for the waiter to be
// told and answer on a slow node, short against the TTL, so that a waiter
// that went away delays the next one little.
func (c *config) reservation() time.Duration {
	return min(c.ttl/2, max(2*c.timeout(), 100*time.Millisecond))
}

// lapse is how long a queue entry stays without being renewed: a waiter
// renews it with every attempt, at least every retry delay, so one that
// went away leaves the queue within this.
func (c *config) lapse() time.Duration {
	return max(time.Second, 4*c.retryMax+2*c.timeout())
}

// timeout returns the effective per-node request timeout.
func (c *config) timeout() time.Duration {
	if c.nodeTimeout != 0 {
		return c.nodeTimeout
	}
	return min(c.ttl/10, MaxNodeTimeout)
}

// validate checks the rules of the contract, once all options are applied.
func (c *config) validate() error {
	switch {
	case c.ttl <= 0:
		return invalid("WithTTL: ttl must be positive, got %v", c.ttl)
	case c.drift < 0 || c.drift >= 1 || c.drift != c.drift:
		return invalid("WithDriftFactor: drift must be in [0,1), got %v", c.drift)
	case c.ttl <= quorum.DriftAllowance(c.ttl, c.drift):
		return invalid("WithTTL: ttl %v must exceed the drift allowance %v", c.ttl, quorum.DriftAllowance(c.ttl, c.drift))
	case c.timeout() <= 0:
		return invalid("WithNodeTimeout: node timeout must be positive, got %v", c.timeout())
	case c.renewInterval < 0:
		return invalid("WithRenewInterval: interval must be positive, got %v", c.renewInterval)
	case c.interval() <= c.timeout():
		return invalid("WithNodeTimeout/WithRenewInterval: node timeout %v must be shorter than the renew interval %v", c.timeout(), c.interval())
	case c.interval() >= c.ttl:
		return invalid("WithRenewInterval: interval %v must be shorter than the TTL %v", c.interval(), c.ttl)
	case c.restartGuard < 0 || (c.restartGuard > 0 && c.restartGuard < c.ttl):
		return invalid("WithRestartGuard: maxTTL %v must be 0 (off) or at least the TTL %v", c.restartGuard, c.ttl)
	case c.retryCount < 0:
		return invalid("WithRetryCount: count must be ≥ 0 (0 = until ctx is done), got %d", c.retryCount)
	case c.renewBatch < 0:
		return invalid("WithRenewBatch: size must be ≥ 0, got %d", c.renewBatch)
	case c.retryMin < 0 || c.retryMax < c.retryMin:
		return invalid("WithRetryDelay: need 0 ≤ min ≤ max, got min %v, max %v", c.retryMin, c.retryMax)
	}
	return nil
}

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
// default is TTL/3. It must be longer than the node timeout and shorter than
// the TTL.
func WithRenewInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.renewInterval = d })
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
// positive and shorter than the renew interval.
func WithNodeTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.nodeTimeout = d })
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

// WithWakeUp turns wake-up on release on or off. On by default: a Lock call
// that finds the lock held subscribes (one connection per node, shared by
// the Client's waiters) to the resource's release channel, and attempts
// again as soon as a release is published; the jittered retry delay is then
// only a fallback for a lost message. Off, it polls with the retry delay.
func WithWakeUp(on bool) Option {
	return optionFunc(func(c *config) { c.wakeUp = on })
}

// WithOnLost sets a function called once when the lock is lost, with an
// error matching ErrLockLost that says how many nodes confirmed and why the
// rest failed. It runs on a goroutine the Client owns, outside any lock of
// the library, so it may call Unlock or Close. It is not called for a lock
// unlocked in time, nor after Close; an Unlock that comes after ValidUntil
// reports the loss that already happened, and so calls it.
func WithOnLost(fn func(l *Lock, err error)) Option {
	return optionFunc(func(c *config) { c.onLost = fn })
}
