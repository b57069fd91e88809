package redlockprom_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

// TestAlert_expiredBeforeRelease runs the seed lesson's alert end to end: a
// Client on three real redis-server nodes holds a fixed lease (no renewal)
// past its TTL, and a real Prometheus server, scraping the Client's
// /metrics every 250ms and evaluating the shipped rules file, sees
// redis_lock_expired_total go from 0 to 1, the rule's own expression turn
// positive, and RedisLockExpiredBeforeRelease fire. Before the expiry the
// expression is empty and the alert quiet. It uses Debian's prometheus
// package (the prometheus binary; .ci/run installs it): skipped without it,
// failed when CI is set.
func TestAlert_expiredBeforeRelease(t *testing.T) {
	bin := prometheusBin(t)
	start := time.Now()
	rc := redistest.Start(t, 3)
	h := redlockprom.New() // the default resource label: "invoice"
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(target.Close)
	prom := startPrometheus(t, bin, strings.TrimPrefix(target.URL, "http://"))

	c, err := redlock.New(rc.Clients(), redlock.WithHooks(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	expr := ruleExpr(t, "RedisLockExpiredBeforeRelease")
	alert := `ALERTS{alertname="RedisLockExpiredBeforeRelease", alertstate="firing"}`

	// A lock released in time starts the series at 0 (the resource label
	// is "invoice" for every invoice); Prometheus scrapes it at 0, so the
	// later increase shows, and neither the expression nor the alert fire.
	first, err := c.Lock(ctx, "invoice:1")
	if err != nil {
		t.Fatalf("Lock(invoice:1) = %v", err)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatalf("Unlock(invoice:1) = %v", err)
	}
	series := `redis_lock_expired_total{resource="invoice"}`
	prom.waitFor(t, series, func(r []sample) bool { return len(r) == 1 && r[0].value == 0 }, "0")
	prom.waitEvaluatedAfter(t, time.Now()) // the rules ran on the 0
	if r := prom.query(t, expr); len(r) != 0 {
		t.Errorf("before the expiry: %s = %v; want empty", expr, r)
	}
	if r := prom.query(t, alert); len(r) != 0 {
		t.Errorf("before the expiry: %s = %v; want empty", alert, r)
	}

	// A fixed lease of 1s: no renewal, so it runs out while we hold it.
	l, err := c.Lock(ctx, "invoice:1234", redlock.WithTTL(time.Second), redlock.WithAutoRenew(false))
	if err != nil {
		t.Fatalf("Lock(invoice:1234) = %v", err)
	}
	select {
	case <-l.Lost(): // a fixed lease is lost at its ValidUntil
	case <-time.After(10 * time.Second):
		t.Fatal("fixed 1s lease not lost 10s after Lock")
	}
	_ = l.Unlock(ctx) // counted once: Lost came first
	if got := gather(t, reg).value("redis_lock_expired_total", labels{"resource": "invoice"}); got != 1 {
		t.Fatalf("registry: redis_lock_expired_total{invoice} = %v; want 1", got)
	}
	prom.waitFor(t, series, func(r []sample) bool { return len(r) == 1 && r[0].value == 1 }, "1")
	prom.waitFor(t, expr, func(r []sample) bool { return len(r) == 1 && r[0].value > 0 }, "positive")
	r := prom.waitFor(t, alert, func(r []sample) bool { return len(r) == 1 }, "firing")
	if got := r[0].labels["resource"]; got != "invoice" {
		t.Errorf("alert labels %v; want resource=invoice", r[0].labels)
	}
	t.Logf("from start to firing alert: %v (Prometheus started, scraped and evaluated the shipped rules)", time.Since(start).Round(time.Millisecond))
}

// prometheusBin returns the path of the prometheus server, or skips the
// test without it (fails it when CI is set: .ci/run installs it).
func prometheusBin(t *testing.T) string {
	t.Helper()
	return fromPrometheusPackage(t, "prometheus")
}

// ruleExpr returns the expression of the named alert in the shipped rules.
func ruleExpr(t *testing.T, alert string) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\s*- alert: ` + alert + `\n\s*expr: (.+)$`)
	m := re.FindSubmatch(redlockprom.Rules())
	if m == nil {
		t.Fatalf("no alert %s in the shipped rules", alert)
	}
	return string(m[1])
}

type sample struct {
	labels map[string]string
	value  float64
}

type promServer struct {
	url string
	out *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // protected by mu
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startPrometheus starts a Prometheus server on 127.0.0.1 that scrapes
// target every 250ms and evaluates the shipped rules as often, waits until
// it is ready (at most 30s), and stops it (by its PID) in a cleanup.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "quorumlock.yml")
	if err := os.WriteFile(rules, redlockprom.Rules(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 250ms
  evaluation_interval: 250ms
rule_files: [%q]
scrape_configs:
  - job_name: quorumlock
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	out := &syncBuffer{}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	p := &promServer{url: "http://127.0.0.1:" + strconv.Itoa(port), out: out}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-done:
			t.Fatalf("prometheus exited: %s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s: %s", out.String())
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// query runs an instant query and returns its vector.
func (p *promServer) query(t *testing.T, q string) []sample {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	if body.Status != "success" {
		t.Fatalf("query %s: %s", q, body.Error)
	}
	var out []sample
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("query %s: value %v: %v", q, r.Value, err)
		}
		out = append(out, sample{r.Metric, v})
	}
	return out
}

// waitEvaluatedAfter waits until the rule group has been evaluated after
// at, at most 20s.
func (p *promServer) waitEvaluatedAfter(t *testing.T, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(p.url + "/api/v1/rules")
		if err != nil {
			t.Fatalf("rules: %v", err)
		}
		var body struct {
			Data struct {
				Groups []struct {
					LastEvaluation time.Time `json:"lastEvaluation"`
				} `json:"groups"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("rules: %v", err)
		}
		if g := body.Data.Groups; len(g) == 1 && g[0].LastEvaluation.After(at) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rules not evaluated within 20s after %v: %+v", at, body.Data.Groups)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor polls q until ok holds, at most 20s (scrapes and rule
// evaluations run every 250ms: 80 rounds).
func (p *promServer) waitFor(t *testing.T, q string, ok func([]sample) bool, what string) []sample {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := p.query(t, q)
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not %s within 20s: %v", q, what, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAlert_expiredOnNewResourceBetweenScrapes runs the case the
// per-resource counter alone misses: a lock taken and lost between two
// scrapes, on a resource label value never locked before. Its
// redis_lock_expired_total series first reaches Prometheus at 1, so
// increase() over it stays empty; the shipped rule still fires, through
// redis_lock_expired_all_total, which Prometheus has seen at 0 since the
// first scrape. Before that, a healthy run — renewed locks on other new
// resources, each released in time — fires nothing. "Between two scrapes"
// is made exact by holding the /metrics page: while held, every scrape
// gets the page Prometheus last saw. A real Prometheus server (Debian's
// prometheus package): skipped without it, failed when CI is set.
func TestAlert_expiredOnNewResourceBetweenScrapes(t *testing.T) {
	bin := prometheusBin(t)
	ns, stop := nodes(3)
	t.Cleanup(stop)
	h := redlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	page := &heldPage{h: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	target := httptest.NewServer(page)
	t.Cleanup(target.Close)
	prom := startPrometheus(t, bin, strings.TrimPrefix(target.URL, "http://"))

	// A 4s TTL renewed every 1.5s; node timeout 1s, far above a round on
	// in-process nodes on a loaded machine.
	c, err := redlock.New(ns, redlock.WithHooks(h), redlock.WithTTL(4*time.Second),
		redlock.WithRenewInterval(time.Second+500*time.Millisecond), redlock.WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	expr := ruleExpr(t, "RedisLockExpiredBeforeRelease")
	perResource := `increase(redis_lock_expired_total[10m]) > 0`
	alert := `ALERTS{alertname="RedisLockExpiredBeforeRelease"}`
	firing := `ALERTS{alertname="RedisLockExpiredBeforeRelease", alertstate="firing"}`
	all := `redis_lock_expired_all_total`

	// Healthy: locks on resources never locked before, one renewed past its
	// TTL, all released in time. Nothing fires.
	prom.waitFor(t, all, func(r []sample) bool { return len(r) == 1 && r[0].value == 0 }, "0")
	for _, res := range []string{"report:1", "export:1", "report:2"} {
		l, err := c.Lock(ctx, res)
		if err != nil {
			t.Fatalf("Lock(%s) = %v", res, err)
		}
		if res == "export:1" {
			time.Sleep(5 * time.Second) // past the 4s TTL: renewed
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock(%s) = %v", res, err)
		}
	}
	prom.waitFor(t, `redis_lock_expired_total{resource="export"}`, func(r []sample) bool { return len(r) == 1 && r[0].value == 0 }, "0")
	prom.waitEvaluatedAfter(t, time.Now())
	for _, q := range []string{expr, alert} {
		if r := prom.query(t, q); len(r) != 0 {
			t.Errorf("healthy run: %s = %v; want empty", q, r)
		}
	}

	// Between two scrapes: a fixed 1s lease on "nightly", never locked
	// before, runs out while held.
	page.hold()
	l, err := c.Lock(ctx, "nightly:2026-12-02", redlock.WithTTL(time.Second), redlock.WithAutoRenew(false))
	if err != nil {
		t.Fatalf("Lock(nightly) = %v", err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("fixed 1s lease not lost 10s after Lock")
	}
	_ = l.Unlock(ctx)
	reg1 := gather(t, reg)
	if got := reg1.value("redis_lock_expired_total", labels{"resource": "nightly"}); got != 1 {
		t.Fatalf("registry: redis_lock_expired_total{nightly} = %v; want 1", got)
	}
	if got := reg1.value("redis_lock_expired_all_total", nil); got != 1 {
		t.Fatalf("registry: redis_lock_expired_all_total = %v; want 1", got)
	}
	nightly := `redis_lock_expired_total{resource="nightly"}`
	if r := prom.query(t, nightly); len(r) != 0 {
		t.Fatalf("%s = %v while the page was held; want absent (never scraped)", nightly, r)
	}
	page.release()

	prom.waitFor(t, nightly, func(r []sample) bool { return len(r) == 1 && r[0].value == 1 }, "1 (first seen at 1)")
	r := prom.waitFor(t, firing, func(r []sample) bool { return len(r) == 1 }, "firing")
	if got, ok := r[0].labels["resource"]; ok {
		t.Errorf("alert labels %v: resource=%q; want none (the unlabelled total fired it)", r[0].labels, got)
	}
	// The per-resource counter alone saw no growth: the case this covers.
	if r := prom.query(t, perResource); len(r) != 0 {
		t.Errorf("%s = %v; want empty (the series appeared at 1)", perResource, r)
	}
}

// heldPage serves h, and while held serves again the last page it served:
// a scrape in between sees what the previous scrape saw.
type heldPage struct {
	h http.Handler

	mu     sync.Mutex
	held   bool        // protected by mu
	last   []byte      // protected by mu: the last page served
	header http.Header // protected by mu: its headers
}

func (p *heldPage) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = true
}

func (p *heldPage) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = false
}

func (p *heldPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held || p.last == nil {
		rec := httptest.NewRecorder()
		p.h.ServeHTTP(rec, r)
		p.last, p.header = rec.Body.Bytes(), rec.Header().Clone()
	}
	for k, v := range p.header {
		w.Header()[k] = v
	}
	w.Write(p.last)
}
