// Package hold measures what it costs one process to hold many auto-renewed
// locks: K locks renewed by one Client's scheduler, batched (one pipeline
// per node per tick) or not. The holdbench and lockbench commands use it.
package hold

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

// Result is the cost of holding K locks in one mode, over the holding
// window only.
type Result struct {
	K                 int
	Mode              string // "batched" or "unbatched"
	AcquireTook       time.Duration
	Losses            int64
	LagP50, LagP99    time.Duration // renewal lag: from due to confirmed
	Renewals          int
	ClientCPUPerMin   float64 // CPU seconds of this process per minute
	ServerCPUPerMin   float64 // CPU seconds of all nodes per minute (INFO cpu)
	RTTPerNodeSec     float64 // round trips (commands or pipelines) per node per second
	CmdsPerNodeSec    float64
	HeapPerLock       float64
	GoroutinesPerLock float64
	CloseTook         time.Duration // Close of the K locks
	KeysLeft          int           // lock keys still on the nodes after Close (all nodes)
	CloseErr          error         // what Close returned
}

// Header names the columns of Row, tab-separated.
const Header = "K\tmode\tacquire\tlosses\trenewals\tlag p50\tlag p99\tclient CPU s/min\tservers CPU s/min\tround trips/node/s\tcmds/node/s\theap B/lock\tgoroutines/lock\tclose\tkeys left\t"

// Row is r as a tab-separated table row matching Header.
func (r Result) Row() string {
	return fmt.Sprintf("%d\t%s\t%v\t%d\t%d\t%v\t%v\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%.4f\t%v\t%d\t", r.K, r.Mode, r.AcquireTook.Round(time.Millisecond),
		r.Losses, r.Renewals, r.LagP50.Round(time.Microsecond), r.LagP99.Round(time.Microsecond), r.ClientCPUPerMin, r.ServerCPUPerMin,
		r.RTTPerNodeSec, r.CmdsPerNodeSec, r.HeapPerLock, r.GoroutinesPerLock, r.CloseTook.Round(time.Millisecond), r.KeysLeft)
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

// Measure holds k locks on the nodes (one client per node is built from
// opts) with renewal mode "batched" or "unbatched" for dur after acquiring
// them, and measures the holding window only. Progress goes to log.
func Measure(ctx context.Context, opts []*redis.Options, k int, mode string, ttl, dur time.Duration, log io.Writer) (Result, error) {
	res := Result{K: k, Mode: mode}
	counters := make([]*counting, len(opts))
	nodes := make([]redis.UniversalClient, len(opts))
	for i, o := range opts {
		counters[i] = &counting{}
		oo := *o
		oo.ContextTimeoutEnabled, oo.PoolSize = true, 64
		cl := redis.NewClient(&oo)
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
	res.AcquireTook = time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return res, fmt.Errorf("acquire: %w", err)
	}
	fmt.Fprintf(log, "K=%d %s: %d locks acquired in %v; holding for %v\n", k, mode, k, res.AcquireTook.Round(time.Millisecond), dur)

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	res.HeapPerLock = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(k)
	res.GoroutinesPerLock = float64(runtime.NumGoroutine()-g0) / float64(k)

	// Measure over the holding window only.
	for _, ct := range counters {
		ct.rtts.Store(0)
		ct.cmds.Store(0)
	}
	cpu0 := cpuTime()
	srv0 := serverCPU(nodes)
	hooks.on.Store(true)
	t0 := time.Now()
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
	hooks.on.Store(false)
	elapsed := time.Since(t0)
	res.ClientCPUPerMin = (cpuTime() - cpu0).Seconds() / elapsed.Minutes()
	res.ServerCPUPerMin = (serverCPU(nodes) - srv0) / elapsed.Minutes()
	var rtts, cmds int64
	for _, ct := range counters {
		rtts += ct.rtts.Load()
		cmds += ct.cmds.Load()
	}
	res.RTTPerNodeSec = float64(rtts) / float64(len(nodes)) / elapsed.Seconds()
	res.CmdsPerNodeSec = float64(cmds) / float64(len(nodes)) / elapsed.Seconds()
	res.Losses = hooks.losses.Load()
	hooks.mu.Lock()
	l := slices.Clone(hooks.lags)
	hooks.mu.Unlock()
	slices.Sort(l)
	res.Renewals = len(l)
	if len(l) > 0 {
		res.LagP50, res.LagP99 = l[len(l)/2], l[len(l)*99/100]
	}
	fmt.Fprintf(log, "K=%d %s: %d renewals, %d losses; releasing\n", k, mode, len(l), res.Losses)
	t1 := time.Now()
	res.CloseErr = c.Close()
	res.CloseTook = time.Since(t1)
	if res.CloseErr != nil {
		fmt.Fprintf(log, "K=%d %s: close: %.200v\n", k, mode, res.CloseErr)
	}
	left, err := lockKeys(nodes, "lock:hold:")
	if err != nil {
		return res, fmt.Errorf("counting keys after Close: %w", err)
	}
	res.KeysLeft = left
	fmt.Fprintf(log, "K=%d %s: Close took %v, %d of %d lock keys left on the nodes\n", k, mode, res.CloseTook.Round(time.Millisecond), left, k*len(nodes))
	return res, nil
}

// lockKeys counts the lock keys under prefix on every node (SCAN; not the
// release guards, queues or fence counters beside them).
func lockKeys(nodes []redis.UniversalClient, prefix string) (int, error) {
	n := 0
	ctx := context.Background()
	for _, nd := range nodes {
		iter := nd.Scan(ctx, 0, prefix+"*", 10000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			if !strings.Contains(k, ":released:") && !strings.HasSuffix(k, ":queue") && !strings.HasSuffix(k, ":fence") {
				n++
			}
		}
		if err := iter.Err(); err != nil {
			return n, err
		}
	}
	return n, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU sums used_cpu_user and used_cpu_sys over every node (INFO cpu;
// 0 where INFO is not available).
func serverCPU(nodes []redis.UniversalClient) float64 {
	total := 0.0
	for _, n := range nodes {
		info, err := n.Info(context.Background(), "cpu").Result()
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
