package redlock

// config is the options' effect: the Client's defaults, and per call those
// merged with the call's options (options.go declares every option).

import (
	"log/slog"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

type config struct {
	ttl           time.Duration
	autoRenew     bool
	renewInterval time.Duration // as set if renewSet; else derived by buildConfig, TTL/3
	renewSet      bool          // WithRenewInterval was given (0 is then invalid, not "derived")
	nodeTimeout   time.Duration // as set if timeoutSet; else derived by buildConfig, min(TTL/10, 1s)
	timeoutSet    bool          // WithNodeTimeout was given
	retryCount    int
	retryMin      time.Duration
	retryMax      time.Duration
	drift         float64
	keyPrefix     string
	keyPrefixSet  bool // WithKeyPrefix was given (invalid per call)
	fencing       bool
	wakeUp        bool
	onLost        func(*Lock, error)
	maxHold       time.Duration // 0: none; see WithMaxHold (maxhold.go)
	hooks         Hooks
	logger        *slog.Logger
	obs           Hooks // hooks and logger together; set by buildConfig
	renewBatch    int
	renewBatchSet bool          // WithRenewBatch was given (invalid per call)
	restartGuard  time.Duration // 0: off; see WithRestartGuard (guard.go)
	localMax      int           // WithLocalHandoff's count (0: off)
	localFor      time.Duration // WithLocalHandoff's time budget
	// plain is set for a call with no per-call option: only such calls
	// pass a lease between them (cohort.go).
	plain bool
	// mode is the kind of lock of a call (rwlock.go), set by the call,
	// never by an option; resources are a multi-lock's (multilock.go).
	mode      Mode
	resources []string
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
		localMax:   DefaultLocalHandoffs,
		localFor:   DefaultLocalHandoffTime,
	}
}

// buildConfig applies opts over base (a nil option is ignored) and checks
// the result: the one place a config is made and validated, for New (base:
// the defaults) and for each call (forCall; base: the Client's), where the
// options valid for New only are refused.
func buildConfig(base config, opts []Option, forCall bool) (config, error) {
	c := base
	c.keyPrefixSet, c.renewBatchSet = false, false
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	c.plain = forCall && len(opts) == 0
	// The derived durations, from this config's TTL unless set: a per-call
	// WithTTL derives them afresh.
	if !c.renewSet {
		c.renewInterval = c.ttl / 3
	}
	if !c.timeoutSet {
		c.nodeTimeout = min(c.ttl/10, MaxNodeTimeout)
	}
	// The hooks to call (WithHooks and WithLogger, hooks.go), nil when
	// there are none.
	switch {
	case c.logger == nil:
		c.obs = c.hooks
	case c.hooks == nil:
		c.obs = logHooks{c.logger}
	default:
		c.obs = multiHooks{c.hooks, logHooks{c.logger}}
	}
	return c, c.validate(forCall)
}

// validate checks the rules of the contract, once all options are applied
// (buildConfig); forCall refuses the options valid for New only.
func (c *config) validate(forCall bool) error {
	switch {
	case forCall && c.keyPrefixSet:
		return invalid("WithKeyPrefix is valid for New only: per call it would hide the key from IsLocked")
	case forCall && c.renewBatchSet:
		return invalid("WithRenewBatch is valid for New only")
	case c.ttl <= 0:
		return invalid("WithTTL: ttl must be positive, got %v", c.ttl)
	case c.drift < 0 || c.drift >= 1 || c.drift != c.drift:
		return invalid("WithDriftFactor: drift must be in [0,1), got %v", c.drift)
	case float64(c.ttl) <= float64(c.ttl)*c.drift+float64(quorum.ClockDriftMin):
		// In float64: near the largest Duration, TTL·drift + 2ms overflows
		// and would pass an integer comparison (found fuzzing option values).
		return invalid("WithTTL: ttl %v must exceed the drift allowance (ttl·%v + %v)", c.ttl, c.drift, quorum.ClockDriftMin)
	case c.nodeTimeout <= 0:
		return invalid("WithNodeTimeout: node timeout must be positive, got %v", c.nodeTimeout)
	case c.renewSet && c.renewInterval <= 0:
		return invalid("WithRenewInterval: interval must be positive, got %v", c.renewInterval)
	case c.renewInterval <= c.nodeTimeout:
		return invalid("WithNodeTimeout/WithRenewInterval: node timeout %v must be shorter than the renew interval %v", c.nodeTimeout, c.renewInterval)
	case c.autoRenew && float64(c.renewInterval)+float64(c.nodeTimeout) >= float64(c.ttl)-float64(c.ttl)*c.drift-float64(quorum.ClockDriftMin):
		// Else no renewal could land in time: one that starts an interval
		// after the grant and takes up to a node timeout must be decided
		// before the validity (TTL − drift allowance) ends. A fixed lease
		// is never renewed. In float64, as above: the sum can overflow a
		// Duration.
		return invalid("WithRenewInterval/WithNodeTimeout: renew interval %v + node timeout %v must be shorter than the TTL %v minus the drift allowance (ttl·%v + %v)",
			c.renewInterval, c.nodeTimeout, c.ttl, c.drift, quorum.ClockDriftMin)
	case c.restartGuard < 0 || (c.restartGuard > 0 && c.restartGuard < c.ttl):
		return invalid("WithRestartGuard: maxTTL %v must be 0 (off) or at least the TTL %v", c.restartGuard, c.ttl)
	case c.maxHold < 0:
		return invalid("WithMaxHold: d must be ≥ 0 (0 = no cap), got %v", c.maxHold)
	case c.retryCount < 0:
		return invalid("WithRetryCount: count must be ≥ 0 (0 = until ctx is done), got %d", c.retryCount)
	case c.renewBatch < 0:
		return invalid("WithRenewBatch: size must be ≥ 0, got %d", c.renewBatch)
	case c.localMax < 0 || c.localFor < 0 || (c.localMax > 0 && c.localFor == 0):
		return invalid("WithLocalHandoff: need n ≥ 0 and d ≥ 0, d > 0 when n > 0, got n %d, d %v", c.localMax, c.localFor)
	case c.retryMin < 0 || c.retryMax < c.retryMin:
		return invalid("WithRetryDelay: need 0 ≤ min ≤ max, got min %v, max %v", c.retryMin, c.retryMax)
	}
	return nil
}

// checkResource refuses resource names that would collide with other keys.
func (c *Client) checkResource(resource string) error {
	switch {
	case resource == "":
		return invalid("resource must not be empty")
	case strings.HasSuffix(resource, fenceSuffix):
		return invalid("resource %q: the suffix %q is reserved for fence counters", resource, fenceSuffix)
	case strings.HasSuffix(resource, scripts.QueueSuffix), strings.HasSuffix(resource, scripts.LapseSuffix):
		return invalid("resource %q: the suffixes %q and %q are reserved for waiter queues", resource, scripts.QueueSuffix, scripts.LapseSuffix)
	case strings.HasSuffix(resource, scripts.ReadersSuffix), strings.HasSuffix(resource, scripts.RWWaitSuffix), strings.HasSuffix(resource, scripts.RWLapseSuffix):
		return invalid("resource %q: the suffixes %q, %q and %q are reserved for read-write locks", resource, scripts.ReadersSuffix, scripts.RWWaitSuffix, scripts.RWLapseSuffix)
	case strings.Contains(resource, scripts.GuardSuffix):
		return invalid("resource %q: %q is reserved for release guards", resource, scripts.GuardSuffix)
	case c.anyCluster && strings.ContainsAny(resource, "{}"):
		return invalid("resource %q: braces are not allowed with Cluster nodes, where the library sets the hash tag itself", resource)
	}
	return nil
}
