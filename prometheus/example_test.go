package redlockprom_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

// nodes starts n in-process Redis nodes whose TTLs run in real time, and
// returns a client for each and a function that stops them all.
func nodes(n int) ([]redis.UniversalClient, func()) {
	var clients []redis.UniversalClient
	var servers []*miniredis.Miniredis
	for range n {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			panic(err)
		}
		servers = append(servers, m)
		clients = append(clients, redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}))
	}
	return clients, func() {
		for i := range clients {
			clients[i].Close()
			servers[i].Close()
		}
	}
}

// printSeries prints the series of the /metrics page at url whose names
// start with one of prefixes.
func printSeries(url string, prefixes ...string) {
	resp, err := http.Get(url)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for _, p := range prefixes {
			if strings.HasPrefix(sc.Text(), p) {
				fmt.Println(sc.Text())
			}
		}
	}
}

func Example() {
	nodes, stop := nodes(3)
	defer stop()

	// By default one series per kind of resource ("invoice"), not per invoice.
	hooks := redlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(hooks)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux) // in a service: a port of its own (not :9090, Prometheus's), and check the error of net.Listen/http.Serve
	defer srv.Close()

	client, err := redlock.New(nodes, redlock.WithHooks(hooks))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	ctx := context.Background()
	lock, err := client.Lock(ctx, "invoice:1234")
	if err != nil {
		panic(err)
	}
	printSeries(srv.URL+"/metrics", "redis_lock_held", "redis_lock_expired_total")
	if err := lock.Unlock(ctx); err != nil {
		panic(err)
	}
	printSeries(srv.URL+"/metrics", "redis_lock_held")
	// Output:
	// redis_lock_expired_total{resource="invoice"} 0
	// redis_lock_held{resource="invoice"} 1
	// redis_lock_held{resource="invoice"} 0
}

func ExampleRenderRules() {
	// Rules() is the shipped file; render it for locks renewed every 5s
	// (WithRenewInterval) and calls that should not wait 2s.
	cfg := redlockprom.DefaultRules()
	cfg.RenewInterval = 5 * time.Second
	cfg.WaitP99 = 2 * time.Second
	rules, err := redlockprom.RenderRules(cfg)
	if err != nil {
		panic(err)
	}
	// A program would write it out: os.WriteFile("quorumlock.yml", rules, 0o644).
	for line := range strings.Lines(string(rules)) {
		if strings.Contains(line, "expr:") && (strings.Contains(line, "renewal_lag") || strings.Contains(line, "wait_duration")) {
			fmt.Print(strings.TrimSpace(line), "\n")
		}
	}
	// Output:
	// expr: histogram_quantile(0.99, rate(redis_lock_renewal_lag_seconds_bucket[5m])) > 1.25
	// expr: histogram_quantile(0.99, sum without (outcome) (rate(redis_lock_wait_duration_seconds_bucket[5m]))) > 2
}
