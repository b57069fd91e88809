package election

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// Defaults.
const (
	DefaultPollInterval = 2 * time.Second // Observe's fallback poll, for a leader whose lease ran out unannounced
	DefaultRetryDelay   = time.Second     // Run's pause after a failed campaign before the next one
)

// Option configures New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	identity       string
	keyPrefix      string
	lockOpts       []redlock.Option
	hooks          Hooks
	logger         *slog.Logger
	nodeTimeout    time.Duration // valid if nodeTimeoutSet; else the lock's
	nodeTimeoutSet bool
	pollInterval   time.Duration
	retryDelay     time.Duration
}

func defaultConfig() config {
	return config{
		identity:     DefaultIdentity(),
		keyPrefix:    redlock.DefaultKeyPrefix,
		pollInterval: DefaultPollInterval,
		retryDelay:   DefaultRetryDelay,
	}
}

func buildConfig(opts []Option) config {
	c := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

func (c *config) validate() error {
	switch {
	case c.identity == "":
		return invalid("WithIdentity: identity must not be empty")
	case c.keyPrefix == "":
		return invalid("WithKeyPrefix: prefix must not be empty")
	case c.nodeTimeoutSet && c.nodeTimeout <= 0:
		return invalid("WithNodeTimeout: timeout must be positive, got %v", c.nodeTimeout)
	case c.pollInterval <= 0:
		return invalid("WithPollInterval: interval must be positive, got %v", c.pollInterval)
	case c.retryDelay <= 0:
		return invalid("WithRetryDelay: delay must be positive, got %v", c.retryDelay)
	}
	return nil
}

// DefaultIdentity returns the identity a candidate has unless WithIdentity
// sets another: "HOSTNAME:PID".
func DefaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// WithIdentity sets the identity this candidate proclaims while it leads;
// Leader and Observe report it on every node. It must not be empty. The
// default is DefaultIdentity(), "HOSTNAME:PID". It is not secret (it is not
// the lock's token) and need not be unique, though it is more useful if it is.
func WithIdentity(id string) Option {
	return optionFunc(func(c *config) { c.identity = id })
}

// WithKeyPrefix sets the key prefix. It must be the prefix of the
// redlock.Client given to New (redlock.WithKeyPrefix; the default of both is
// "lock:", redlock.DefaultKeyPrefix): the election reads the lock key to tie
// the leader's identity to its lease, and a mismatch leaves every candidate
// unable to proclaim itself (Campaign then fails with ErrNoQuorum).
func WithKeyPrefix(p string) Option {
	return optionFunc(func(c *config) { c.keyPrefix = p })
}

// WithLockOptions sets the per-call options of the lock behind each
// campaign, e.g. redlock.WithTTL (the lease, and so how long a dead leader
// keeps the office), redlock.WithFencing (Term.Fence then returns the
// leader's fencing token) or redlock.WithRetryCount(1) (Campaign makes one
// attempt, like TryLock). redlock.WithKeyPrefix is not allowed here: use
// WithKeyPrefix. None by default: the Client's defaults apply.
func WithLockOptions(opts ...redlock.Option) Option {
	return optionFunc(func(c *config) { c.lockOpts = append(c.lockOpts, opts...) })
}

// WithHooks sets the hooks told of leadership acquired, lost and resigned.
// The Prometheus and OpenTelemetry adapters of the redlock hooks
// (modules prometheus/ and otel/) implement Hooks too, so the value given to
// redlock.WithHooks can be given here as well. None by default.
func WithHooks(h Hooks) Option {
	return optionFunc(func(c *config) { c.hooks = h })
}

// WithLogger logs leadership changes to l: acquired and resigned at Info,
// lost at Error, failed identity writes at Warn. None by default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithNodeTimeout sets how long one of the election's own requests to one
// node may take (identity reads and writes, announcements). The default is
// the node timeout of the campaigns' lock, as the redlock Client gives it
// (WithNodeTimeout of WithLockOptions, or by default a tenth of
// the TTL, at most 1s), so that an election request times out only where
// the lock's would: the two share the node clients' connection pools, and
// go-redis closes a connection whose request timed out. It must be
// positive.
func WithNodeTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.nodeTimeout, c.nodeTimeoutSet = d, true })
}

// WithPollInterval sets how often Observe reads the leader even when no
// announcement arrives, so that a leader whose lease ran out (its process
// died or paused, and nobody took over yet) is seen to be gone. The default
// is 2s. It must be positive.
func WithPollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pollInterval = d })
}

// WithRetryDelay sets how long Run waits after a campaign that failed (for
// instance, too few nodes took the leader's identity) before the next one.
// The default is 1s. It must be positive.
func WithRetryDelay(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryDelay = d })
}
