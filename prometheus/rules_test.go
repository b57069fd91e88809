package redlockprom_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

var update = flag.Bool("update", false, "rewrite rules/quorumlock.yml from the template with the default thresholds")

// TestRules_defaultFileIsRendered checks that the shipped rules file (the
// one promtool checks, and Rules returns) is the template rendered with
// DefaultRules, so the two cannot drift apart.
func TestRules_defaultFileIsRendered(t *testing.T) {
	got, err := redlockprom.RenderRules(redlockprom.DefaultRules())
	if err != nil {
		t.Fatalf("RenderRules(DefaultRules()) = %v", err)
	}
	if *update {
		if err := os.WriteFile("rules/quorumlock.yml", got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if want := redlockprom.Rules(); !bytes.Equal(got, want) {
		t.Errorf("rules/quorumlock.yml is not RenderRules(DefaultRules()); run: go test -run TestRules_defaultFileIsRendered -update")
	}
}

func TestRenderRules_invalid(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		field string
		edit  func(*redlockprom.RulesConfig)
	}{
		{"zero window", "ExpiredWindow", func(c *redlockprom.RulesConfig) { c.ExpiredWindow = 0 }},
		{"sub-millisecond duration", "QuorumFor", func(c *redlockprom.RulesConfig) { c.QuorumFor = time.Second + time.Microsecond }},
		{"negative expired", "ExpiredMax", func(c *redlockprom.RulesConfig) { c.ExpiredMax = -1 }},
		{"negative rate", "NodeErrorRate", func(c *redlockprom.RulesConfig) { c.NodeErrorRate = -0.1 }},
		{"fraction above 1", "RenewalLagFraction", func(c *redlockprom.RulesConfig) { c.RenewalLagFraction = 1.5 }},
		{"zero fraction", "RenewalLagFraction", func(c *redlockprom.RulesConfig) { c.RenewalLagFraction = 0 }},
		{"lag beyond the buckets", "RenewalLagFraction", func(c *redlockprom.RulesConfig) { c.RenewInterval = time.Minute; c.RenewalLagFraction = 0.6 }},
		{"wait beyond the buckets", "WaitP99", func(c *redlockprom.RulesConfig) { c.WaitP99 = 5 * time.Minute }},
		{"zero config", "ExpiredWindow", func(c *redlockprom.RulesConfig) { *c = redlockprom.RulesConfig{} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := redlockprom.DefaultRules()
			tc.edit(&cfg)
			b, err := redlockprom.RenderRules(cfg)
			if !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("RenderRules(%+v) = %v; want ErrInvalidArgument naming %s", cfg, err, tc.field)
			}
			if b != nil {
				t.Errorf("RenderRules rendered %d bytes with an invalid config; want none", len(b))
			}
		})
	}
}

// TestRenderRules_thresholds checks that non-default thresholds reach the
// expressions.
func TestRenderRules_thresholds(t *testing.T) {
	t.Parallel()
	cfg := redlockprom.DefaultRules()
	cfg.ExpiredWindow = 90 * time.Second
	cfg.ExpiredMax = 3
	cfg.RenewInterval = 2 * time.Second
	cfg.RenewalLagFraction = 0.5
	cfg.WaitP99 = 1500 * time.Millisecond
	cfg.NoLeaderFor = 45 * time.Second
	b, err := redlockprom.RenderRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"increase(redis_lock_expired_total[90s]) > 3",
		"rate(redis_lock_renewal_lag_seconds_bucket[5m])) > 1\n",
		"rate(redis_lock_wait_duration_seconds_bucket[5m]))) > 1.5\n",
		"for: 45s",
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("RenderRules(%+v) lacks %q", cfg, want)
		}
	}
}

// promtool returns the path of promtool, or skips the test without it
// (fails it when CI is set: .ci/run installs Debian's prometheus package).
func promtool(t *testing.T) string {
	t.Helper()
	return fromPrometheusPackage(t, "promtool")
}

// fromPrometheusPackage returns the path of a program of Debian's
// prometheus package (promtool, prometheus), or skips the test without it
// (fails it when CI is set).
func fromPrometheusPackage(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(name + " not on PATH (apt-get install -y prometheus)")
		}
		t.Skip(name + " not on PATH: apt-get install -y prometheus")
	}
	return p
}

func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestRules_promtool runs promtool check rules on the shipped rules and on
// rules rendered with other thresholds, and the shipped rules' unit tests
// (rules/quorumlock_test.yml: every alert firing on series that should fire
// it, and quiet on series that should not).
func TestRules_promtool(t *testing.T) {
	t.Parallel()
	runPromtool(t, "check", "rules", "rules/quorumlock.yml")
	cfg := redlockprom.DefaultRules()
	cfg.ExpiredWindow, cfg.ExpiredMax, cfg.RenewalLagFraction, cfg.WaitP99 = 90*time.Second, 2, 0.5, 1500*time.Millisecond
	b, err := redlockprom.RenderRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	custom := filepath.Join(t.TempDir(), "custom.yml")
	if err := os.WriteFile(custom, b, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "check", "rules", custom)
	out := runPromtool(t, "test", "rules", "rules/quorumlock_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}
}

// dashboard is the part of the Grafana JSON the tests read.
type dashboard struct {
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVars replaces the dashboard's variables with values a PromQL
// parser accepts, as Grafana does before it sends a query.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__range", "6h", "$job", ".+", "$instance", ".+")

// TestDashboard_queriesParse parses every query of the dashboard with
// promtool (as recording rules of a scratch rules file: promtool check
// rules parses each expression with Prometheus's own parser), and checks
// that every panel uses the $datasource variable.
func TestDashboard_queriesParse(t *testing.T) {
	t.Parallel()
	d := parseDashboard(t)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v; want uid ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			n++
			q, err := json.Marshal(grafanaVars.Replace(tg.Expr)) // a JSON string is a YAML string
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", n, q)
		}
	}
	if n < 15 {
		t.Fatalf("dashboard has %d queries; want the 15 or more it ships", n)
	}
	f := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "check", "rules", f)
}

func parseDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(redlockprom.Dashboard(), &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	return d
}

var seriesName = regexp.MustCompile(`\b(redis_(?:lock|election)_[a-z_]+)`)

// TestRulesAndDashboard_useExportedSeries checks that every series the
// rules and the dashboard name is one the adapter exports, and that the
// dashboard covers what the issue asked of it.
func TestRulesAndDashboard_useExportedSeries(t *testing.T) {
	t.Parallel()
	exported := exportedFamilies(t)
	used := map[string]bool{}
	for _, src := range [][]byte{redlockprom.Rules(), redlockprom.Dashboard()} {
		for _, m := range seriesName.FindAllStringSubmatch(string(src), -1) {
			name := m[1]
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
					name = base
				}
			}
			used[name] = true
			if !exported[name] {
				t.Errorf("%s is used by the rules or the dashboard but not exported", m[1])
			}
		}
	}
	for name := range exported {
		if !used[name] {
			t.Errorf("%s is exported but neither alerted on nor shown", name)
		}
	}
}

// exportedFamilies returns the names of the metric families a Hooks
// exports once every kind of event has been seen.
func exportedFamilies(t *testing.T) map[string]bool {
	t.Helper()
	h := redlockprom.New(redlockprom.WithElections("scheduler"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	replay(h)
	ctx := context.Background()
	h.Attempt(ctx, redlock.AttemptInfo{Resource: "r", Granted: 3, Quorum: 3, Nodes: 5, Outcome: redlock.OutcomeAcquired})
	h.Extend(ctx, redlock.ExtendInfo{Resource: "r", Renewal: true, Confirmed: 5, Quorum: 3, Nodes: 5})
	h.NodeError(ctx, redlock.NodeErrorInfo{Resource: "r", Op: "extend", Node: 1, Addr: "a:1", Kind: "timeout"})
	h.Leadership(ctx, election.LeadershipInfo{Election: "scheduler", Event: election.EventAcquired, Wait: time.Millisecond})
	h.Leadership(ctx, election.LeadershipInfo{Election: "scheduler", Event: election.EventLost, Held: time.Second})
	out := map[string]bool{}
	for name := range gather(t, reg) {
		out[name] = true
	}
	return out
}
