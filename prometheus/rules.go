package redlockprom

import (
	"bytes"
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"text/template"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// The shipped files. rules/quorumlock.yml is RenderRules(DefaultRules()),
// checked by TestRules_defaultFileIsRendered; promtool checks it and runs
// its unit tests (rules/quorumlock_test.yml) in TestRules_promtool.
var (
	//go:embed rules/quorumlock.yml
	rulesYAML []byte
	//go:embed rules/quorumlock.yml.tmpl
	rulesTemplate string
	//go:embed dashboards/quorumlock.json
	dashboardJSON []byte
)

// Rules returns the shipped Prometheus alerting rules with the default
// thresholds ([DefaultRules]): the file rules/quorumlock.yml of this module,
// for a rule_files entry of prometheus.yml or a PrometheusRule's spec. Write
// it out with os.WriteFile; render other thresholds with [RenderRules].
//
// The alerts: RedisLockExpiredBeforeRelease (locks lost or expired before
// their holder released them: the TTL is too short or the process paused),
// RedisLockNodeErrors (a node fails requests), RedisLockQuorumAtRisk (one
// more failing node and no lock can be taken), RedisLockRenewalLag
// (renewals run late), RedisLockWaitHigh (Lock calls wait long) and
// RedisElectionNoLeader (an election without a leader). Each says what to
// do in its description.
func Rules() []byte { return bytes.Clone(rulesYAML) }

// Dashboard returns the shipped Grafana dashboard (JSON; import it, or
// provision dashboards/quorumlock.json of this module): acquisitions by
// outcome, wait and hold times, locks held, locks expired before release,
// renewal lag and failures, node errors by node and kind, failing nodes,
// quorum headroom and margin, election leadership. Its queries use a
// Prometheus data source chosen with the $datasource variable and filter
// on $job and $instance.
func Dashboard() []byte { return bytes.Clone(dashboardJSON) }

// RulesConfig holds the thresholds of the alerting rules. Start from
// [DefaultRules] and change what you need; RenderRules validates every
// field. Durations are rendered in Prometheus's notation and must be whole
// milliseconds.
type RulesConfig struct {
	// ExpiredWindow is the window over which locks expired before their
	// release are counted. Default 10m.
	ExpiredWindow time.Duration
	// ExpiredMax is how many such locks per window are tolerated, ≥ 0:
	// per resource, and per process over all resources together
	// (redis_lock_expired_all_total, which also sees a loss on a resource
	// first seen between two scrapes). Default 0: every one alerts (the
	// seed lesson's rule).
	ExpiredMax int
	// NodeErrorRate is the failed requests per second to one node, over
	// 5 minutes, above which RedisLockNodeErrors fires; ≥ 0. Default 0.1.
	NodeErrorRate float64
	// NodeErrorsFor is how long the rate must stay above it. Default 5m.
	NodeErrorsFor time.Duration
	// QuorumFor is how long the quorum headroom must stay ≤ 0 before
	// RedisLockQuorumAtRisk fires. Default 2m.
	QuorumFor time.Duration
	// RenewInterval is your locks' renew interval (WithRenewInterval).
	// Default redlock.DefaultTTL/3 (10s).
	RenewInterval time.Duration
	// RenewalLagFraction is the share of RenewInterval that the p99
	// renewal lag must exceed for RenewalLagFor before RedisLockRenewalLag
	// fires; in (0, 1]. Default 0.25. The threshold,
	// RenewalLagFraction × RenewInterval, must be below 32.768s, the
	// highest bucket of redis_lock_renewal_lag_seconds.
	RenewalLagFraction float64
	// RenewalLagFor is how long the lag must stay above it. Default 5m.
	RenewalLagFor time.Duration
	// WaitP99 is the p99 of Lock and TryLock call durations, over 5
	// minutes, above which RedisLockWaitHigh fires; below 262.144s, the
	// highest bucket of redis_lock_wait_duration_seconds. Default 5s.
	WaitP99 time.Duration
	// WaitFor is how long the p99 must stay above it. Default 10m.
	WaitFor time.Duration
	// NoLeaderFor is how long an election must have no leader before
	// RedisElectionNoLeader fires: set it above the election's TTL (a new
	// leader may wait that long for the old lease). Default 1m.
	NoLeaderFor time.Duration
}

// Highest finite buckets: a p99 above them cannot be told apart.
const (
	maxLagBucket  = 32.768  // 0.0005 × 2^16
	maxWaitBucket = 262.144 // 0.001 × 4^9
)

// DefaultRules returns the thresholds of the shipped rules.
func DefaultRules() RulesConfig {
	return RulesConfig{
		ExpiredWindow:      10 * time.Minute,
		ExpiredMax:         0,
		NodeErrorRate:      0.1,
		NodeErrorsFor:      5 * time.Minute,
		QuorumFor:          2 * time.Minute,
		RenewInterval:      redlock.DefaultTTL / 3,
		RenewalLagFraction: 0.25,
		RenewalLagFor:      5 * time.Minute,
		WaitP99:            5 * time.Second,
		WaitFor:            10 * time.Minute,
		NoLeaderFor:        time.Minute,
	}
}

// RenderRules returns the alerting rules with the thresholds of cfg, in the
// shape of [Rules]. A field out of range, or a duration that is not a
// positive whole number of milliseconds, is an error matching
// redlock.ErrInvalidArgument that names the field; nothing is rendered.
func RenderRules(cfg RulesConfig) ([]byte, error) {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("%w: RulesConfig.%s = %v; want %s", redlock.ErrInvalidArgument, field, v, want)
	}
	durs := []struct {
		name string
		d    time.Duration
	}{
		{"ExpiredWindow", cfg.ExpiredWindow}, {"NodeErrorsFor", cfg.NodeErrorsFor}, {"QuorumFor", cfg.QuorumFor},
		{"RenewInterval", cfg.RenewInterval}, {"RenewalLagFor", cfg.RenewalLagFor}, {"WaitP99", cfg.WaitP99},
		{"WaitFor", cfg.WaitFor}, {"NoLeaderFor", cfg.NoLeaderFor},
	}
	for _, d := range durs {
		if d.d < time.Millisecond || d.d%time.Millisecond != 0 {
			return nil, bad(d.name, d.d, "a positive whole number of milliseconds")
		}
	}
	lag := cfg.RenewalLagFraction * cfg.RenewInterval.Seconds()
	switch {
	case cfg.ExpiredMax < 0:
		return nil, bad("ExpiredMax", cfg.ExpiredMax, "≥ 0")
	case !(cfg.NodeErrorRate >= 0) || math.IsInf(cfg.NodeErrorRate, 0):
		return nil, bad("NodeErrorRate", cfg.NodeErrorRate, "a finite rate ≥ 0")
	case !(cfg.RenewalLagFraction > 0 && cfg.RenewalLagFraction <= 1):
		return nil, bad("RenewalLagFraction", cfg.RenewalLagFraction, "in (0, 1]")
	case lag >= maxLagBucket:
		return nil, bad("RenewalLagFraction", cfg.RenewalLagFraction,
			fmt.Sprintf("RenewalLagFraction × RenewInterval (%gs) below %gs, the highest renewal lag bucket", lag, maxLagBucket))
	case cfg.WaitP99.Seconds() >= maxWaitBucket:
		return nil, bad("WaitP99", cfg.WaitP99, fmt.Sprintf("below %gs, the highest wait bucket", maxWaitBucket))
	}
	tmpl, err := template.New("rules").Delims("<%", "%>").Option("missingkey=error").Parse(rulesTemplate)
	if err != nil {
		return nil, err // the embedded template is checked by the tests
	}
	num := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	data := map[string]string{
		"Header":                    "Generated by redlockprom.RenderRules; the shipped file is RenderRules(DefaultRules()).",
		"ExpiredWindow":             promDuration(cfg.ExpiredWindow),
		"ExpiredMax":                strconv.Itoa(cfg.ExpiredMax),
		"NodeErrorRate":             num(cfg.NodeErrorRate),
		"NodeErrorsFor":             promDuration(cfg.NodeErrorsFor),
		"QuorumFor":                 promDuration(cfg.QuorumFor),
		"RenewalLagSeconds":         num(math.Round(lag*1e6) / 1e6),
		"RenewalLagFractionPercent": num(math.Round(cfg.RenewalLagFraction*1e4) / 100),
		"RenewIntervalText":         cfg.RenewInterval.String(),
		"RenewalLagFor":             promDuration(cfg.RenewalLagFor),
		"WaitP99Seconds":            num(cfg.WaitP99.Seconds()),
		"WaitP99Text":               cfg.WaitP99.String(),
		"WaitFor":                   promDuration(cfg.WaitFor),
		"NoLeaderFor":               promDuration(cfg.NoLeaderFor),
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// promDuration writes d (a positive whole number of milliseconds) in
// Prometheus's duration notation, in its largest exact unit: 10m, 90s,
// 1500ms.
func promDuration(d time.Duration) string {
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d%u.unit == 0 {
			return strconv.FormatInt(int64(d/u.unit), 10) + u.name
		}
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}
