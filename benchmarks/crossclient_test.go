package benchmarks

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/internal/redistest"
)

// TestCrossClientContention checks fairness across K clients (each a
// library instance of its own with its own connections, like K processes)
// taking turns on one key with no hold time: quorumlock must hand most
// acquisitions to another client than the last holder. It also logs
// acquisitions per second, the share to another client, the longest wait
// and the servers' command time per acquisition (INFO commandstats, summed
// over the nodes) beside redsync's. Libraries run interleaved,
// QUORUMLOCK_CROSSCLIENT_ROUNDS times (default 1), each for
// QUORUMLOCK_CROSSCLIENT_SECONDS (default 1); the figures are the medians:
//
//	QUORUMLOCK_CROSSCLIENT_ROUNDS=3 QUORUMLOCK_CROSSCLIENT_SECONDS=5 go test -run TestCrossClientContention -v .
//
// The README's figures come from lockbench's clients scenario, which also
// reads the nodes' and the client's CPU time (see README.md here).
func TestCrossClientContention(t *testing.T) {
	rounds, secs := envInt(t, "QUORUMLOCK_CROSSCLIENT_ROUNDS", 1), envInt(t, "QUORUMLOCK_CROSSCLIENT_SECONDS", 1)
	const clients = 8
	rc := redistest.Start(t, 5)
	ls := []libs.Lib{}
	for _, l := range libs.All {
		if l.Name == "quorumlock" || l.Name == "redsync" {
			ls = append(ls, l)
		}
	}
	results := map[string][]crossResult{}
	for round := range rounds {
		for _, lib := range ls {
			r := runCrossClient(t, rc, lib, clients, time.Duration(secs)*time.Second, fmt.Sprintf("cc:%s:%d", lib.Name, round))
			results[lib.Name] = append(results[lib.Name], r)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d clients on one key, hold 0, 5 nodes, %d×%ds, medians:\n", clients, rounds, secs)
	fmt.Fprintf(&b, "%-11s %10s %12s %12s %14s %10s\n", "lib", "acq/s", "to another", "longest wait", "server µs/acq", "errors")
	med := map[string]crossResult{}
	for _, lib := range ls {
		m := medianCross(results[lib.Name])
		med[lib.Name] = m
		fmt.Fprintf(&b, "%-11s %10.0f %11.0f%% %12v %14.0f %10d\n", lib.Name, m.rate, 100*m.toOther, m.longest.Round(time.Millisecond), m.serverUS, m.errors)
	}
	q, rs := med["quorumlock"], med["redsync"]
	if rs.rate > 0 && rs.longest > 0 && rs.serverUS > 0 {
		fmt.Fprintf(&b, "quorumlock/redsync: acq/s %.2f×, longest wait %.2f×, server command time per acquisition %.2f×\n",
			q.rate/rs.rate, float64(q.longest)/float64(rs.longest), q.serverUS/rs.serverUS)
	}
	t.Log("\n" + b.String())
	for name, m := range med {
		if m.errors > 0 {
			t.Errorf("%s: %d Lock or Unlock errors", name, m.errors)
		}
	}
	if q.acquisitions > 0 && q.toOther < 0.5 {
		t.Errorf("quorumlock handed %.0f%% of acquisitions to another client; want most (a queue serves waiters in turn)", 100*q.toOther)
	}
}

type crossResult struct {
	acquisitions int
	rate         float64 // per second
	toOther      float64 // share of acquisitions by another client than the last holder
	longest      time.Duration
	serverUS     float64 // server command time per acquisition (INFO commandstats), µs, all nodes
	errors       int
}

func runCrossClient(t *testing.T, rc *redistest.Cluster, lib libs.Lib, k int, d time.Duration, resource string) crossResult {
	t.Helper()
	var lockers []libs.Locker
	for range k {
		lk, err := lib.New(nodeClients(t, rc), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lk.Close() })
		lockers = append(lockers, lk)
	}
	before := serverUsec(t, rc)
	var (
		mu      sync.Mutex
		res     crossResult
		last    = -1
		handoff int
	)
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for g, lk := range lockers {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				h, err := lk.Lock(ctx, resource)
				wait := time.Since(t0)
				mu.Lock()
				res.longest = max(res.longest, wait)
				mu.Unlock()
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						res.errors++
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				res.acquisitions++
				if last >= 0 {
					handoff++
					if last != g {
						res.toOther++
					}
				}
				last = g
				mu.Unlock()
				if err := h.Unlock(context.Background()); err != nil {
					mu.Lock()
					res.errors++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	used := serverUsec(t, rc) - before
	res.rate = float64(res.acquisitions) / elapsed.Seconds()
	if handoff > 0 {
		res.toOther /= float64(handoff)
	}
	if res.acquisitions > 0 {
		res.serverUS = used / float64(res.acquisitions)
	}
	return res
}

// serverUsec sums the usec of every command in INFO commandstats over the
// nodes.
func serverUsec(t *testing.T, rc *redistest.Cluster) float64 {
	t.Helper()
	total := 0.0
	for i := range rc.N() {
		info, err := rc.Admin(i).Info(t.Context(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			_, rest, ok := strings.Cut(line, "usec=")
			if !ok {
				continue
			}
			v, _, _ := strings.Cut(rest, ",")
			n, _ := strconv.ParseFloat(v, 64)
			total += n
		}
	}
	return total
}

func medianCross(rs []crossResult) crossResult {
	pick := func(f func(crossResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	var m crossResult
	m.rate = pick(func(r crossResult) float64 { return r.rate })
	m.toOther = pick(func(r crossResult) float64 { return r.toOther })
	m.longest = time.Duration(pick(func(r crossResult) float64 { return float64(r.longest) }))
	m.serverUS = pick(func(r crossResult) float64 { return r.serverUS })
	m.acquisitions = int(pick(func(r crossResult) float64 { return float64(r.acquisitions) }))
	for _, r := range rs {
		m.errors += r.errors
	}
	return m
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}
