// Command holdbench measures what it costs one process to hold many
// auto-renewed locks: K locks on N real redis-server nodes, renewed by the
// Client's one scheduler, batched (one pipeline per node per tick) or not.
//
//	cd benchmarks && go run ./cmd/holdbench -k 1000,10000,100000 -ttl 30s -duration 60s
//	cd benchmarks && go run ./cmd/holdbench -k 1000,10000 -ttl 3s -duration 20s
//
// For each K and mode it reports: losses (must be 0 on healthy nodes),
// renewal lag p50/p99 (from when a renewal was due to its confirmation),
// client CPU seconds per minute, server CPU seconds per minute (all nodes),
// round trips and commands per node per second, heap bytes and goroutines
// per held lock.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	ks := flag.String("k", "1000,10000", "comma-separated numbers of locks to hold")
	n := flag.Int("nodes", 5, "redis-server nodes to start")
	ttl := flag.Duration("ttl", 30*time.Second, "lock TTL (renewed every TTL/3)")
	dur := flag.Duration("duration", 60*time.Second, "how long to hold them, after acquiring")
	modes := flag.String("modes", "batched,unbatched", "renewal modes to compare")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *ks, *n, *ttl, *dur, strings.Split(*modes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "holdbench:", err)
		os.Exit(1)
	}
}

type result struct {
	k                 int
	mode              string
	acquireTook       time.Duration
	losses            int64
	lagP50, lagP99    time.Duration
	renewals          int
	clientCPUPerMin   float64
	serverCPUPerMin   float64
	rttPerNodeSec     float64
	cmdsPerNodeSec    float64
	heapPerLock       float64
	goroutinesPerLock float64
}

func run(ctx context.Context, ks string, n int, ttl, dur time.Duration, modes []string) error {
	redis.SetLogger(quiet{})
	rc, err := redistest.StartCluster(n)
	if err != nil {
		return err
	}
	defer rc.Close()
	fmt.Printf("holdbench: %d redis-server nodes on 127.0.0.1, TTL %v (renewed every %v), held %v; %d CPUs (%s/%s), %s\n",
		n, ttl, ttl/3, dur, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "K\tmode\tacquire\tlosses\trenewals\tlag p50\tlag p99\tclient CPU s/min\tservers CPU s/min\tround trips/node/s\tcmds/node/s\theap B/lock\tgoroutines/lock\t")
	for _, kstr := range strings.Split(ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(kstr))
		if err != nil {
			return err
		}
		for _, mode := range modes {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := measure(ctx, rc, k, mode, ttl, dur)
			if err != nil {
				// An overloaded mode (unbatched, many locks) may not even
				// acquire them all: that is a result too.
				fmt.Fprintf(tw, "%d\t%s\tfailed: %.80s\t\n", k, mode, strings.ReplaceAll(err.Error(), "\n", "; "))
			} else {
				fmt.Fprintf(tw, "%d\t%s\t%v\t%d\t%d\t%v\t%v\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%.4f\t\n", r.k, r.mode, r.acquireTook.Round(time.Millisecond),
					r.losses, r.renewals, r.lagP50.Round(time.Microsecond), r.lagP99.Round(time.Microsecond), r.clientCPUPerMin, r.serverCPUPerMin,
					r.rttPerNodeSec, r.cmdsPerNodeSec, r.heapPerLock, r.goroutinesPerLock)
			}
			fmt.Fprintf(os.Stderr, "done: K=%d %s\n", k, mode)
			for i := range n {
				rc.Admin(i).FlushAll(context.Background())
			}
		}
	}
	return tw.Flush()
}

// counting counts round trips and commands to one node.
type counting struct{ rtts, cmds atomic.Int64 }

func (c *counting) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counting) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.rtts.Add(1)
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (c *counting) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.rtts.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// lags records renewal lags and losses.
type lags struct {
	redlock.NoHooks
	mu     sync.Mutex
	lags   []time.Duration
	losses atomic.Int64
	on     atomic.Bool
}

func (h *lags) Extend(_ context.Context, i redlock.ExtendInfo) {
	if i.Renewal && i.Err == nil && h.on.Load() {
		h.mu.Lock()
		h.lags = append(h.lags, i.Lag)
		h.mu.Unlock()
	}
}
func (h *lags) Lost(context.Context, redlock.LostInfo) { h.losses.Add(1) }

func measure(ctx context.Context, rc *redistest.Cluster, k int, mode string, ttl, dur time.Duration) (result, error) {
	res := result{k: k, mode: mode}
	counters := make([]*counting, rc.N())
	nodes := make([]redis.UniversalClient, rc.N())
	for i := range rc.N() {
		counters[i] = &counting{}
		cl := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: true, PoolSize: 64})
		cl.AddHook(counters[i])
		defer cl.Close()
		nodes[i] = cl
	}
	batch := redlock.DefaultRenewBatch
	if mode == "unbatched" {
		batch = 0
	} else if mode != "batched" {
		return res, fmt.Errorf("mode %q: want batched or unbatched", mode)
	}
	hooks := &lags{}
	c, err := redlock.New(nodes, redlock.WithTTL(ttl), redlock.WithRenewBatch(batch), redlock.WithHooks(hooks), redlock.WithWakeUp(false))
	if err != nil {
		return res, err
	}
	defer c.Close()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	start := time.Now()
	locks := make([]*redlock.Lock, k)
	var wg sync.WaitGroup
	var next atomic.Int64
	var firstErr atomic.Value
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= k || ctx.Err() != nil {
					return
				}
				// An overloaded client (unbatched, many locks, short TTL)
				// may fail attempts: retry for a while.
				actx, cancel := context.WithTimeout(ctx, 30*time.Second)
				l, err := c.Lock(actx, fmt.Sprintf("hold:%d", i))
				cancel()
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				locks[i] = l
			}
		})
	}
	wg.Wait()
	res.acquireTook = time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return res, fmt.Errorf("acquire: %w", err)
	}
	fmt.Fprintf(os.Stderr, "K=%d %s: %d locks acquired in %v; holding for %v\n", k, mode, k, res.acquireTook.Round(time.Millisecond), dur)

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	res.heapPerLock = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(k)
	res.goroutinesPerLock = float64(runtime.NumGoroutine()-g0) / float64(k)

	// Measure over the holding window only.
	for _, ct := range counters {
		ct.rtts.Store(0)
		ct.cmds.Store(0)
	}
	cpu0 := cpuTime()
	srv0 := serverCPU(rc)
	hooks.on.Store(true)
	t0 := time.Now()
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
	hooks.on.Store(false)
	elapsed := time.Since(t0)
	res.clientCPUPerMin = (cpuTime() - cpu0).Seconds() / elapsed.Minutes()
	res.serverCPUPerMin = (serverCPU(rc) - srv0) / elapsed.Minutes()
	var rtts, cmds int64
	for _, ct := range counters {
		rtts += ct.rtts.Load()
		cmds += ct.cmds.Load()
	}
	res.rttPerNodeSec = float64(rtts) / float64(rc.N()) / elapsed.Seconds()
	res.cmdsPerNodeSec = float64(cmds) / float64(rc.N()) / elapsed.Seconds()
	res.losses = hooks.losses.Load()
	hooks.mu.Lock()
	l := slices.Clone(hooks.lags)
	hooks.mu.Unlock()
	slices.Sort(l)
	res.renewals = len(l)
	if len(l) > 0 {
		res.lagP50, res.lagP99 = l[len(l)/2], l[len(l)*99/100]
	}
	fmt.Fprintf(os.Stderr, "K=%d %s: %d renewals, %d losses; releasing\n", k, mode, len(l), res.losses)
	if err := c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "K=%d %s: close: %.200v\n", k, mode, err)
	}
	return res, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU sums used_cpu_user and used_cpu_sys over every node (INFO cpu).
func serverCPU(rc *redistest.Cluster) float64 {
	total := 0.0
	for i := range rc.N() {
		info, err := rc.Admin(i).Info(context.Background(), "cpu").Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
