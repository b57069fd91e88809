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
// per held lock, how long Close took to release them, and how many lock
// keys it left on the nodes (counted with SCAN; 0 on healthy nodes).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/hold"
	"github.com/quorumlock/quorumlock/internal/redistest"
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

func run(ctx context.Context, ks string, n int, ttl, dur time.Duration, modes []string) error {
	redis.SetLogger(quiet{})
	rc, err := redistest.StartCluster(n)
	if err != nil {
		return err
	}
	defer rc.Close()
	fmt.Printf("holdbench: %d redis-server nodes on 127.0.0.1, TTL %v (renewed every %v), held %v; %d CPUs (%s/%s), %s\n",
		n, ttl, ttl/3, dur, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	opts := make([]*redis.Options, n)
	for i := range n {
		opts[i] = &redis.Options{Addr: rc.ServerAddr(i)}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	defer tw.Flush()
	fmt.Fprintln(tw, hold.Header)
	for _, kstr := range strings.Split(ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(kstr))
		if err != nil {
			return err
		}
		for _, mode := range modes {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := hold.Measure(ctx, opts, k, mode, ttl, dur, os.Stderr)
			if err != nil {
				// An overloaded mode (unbatched, many locks) may not even
				// acquire them all: that is a result too.
				fmt.Fprintf(tw, "%d\t%s\tfailed: %.80s\t\n", k, mode, strings.ReplaceAll(err.Error(), "\n", "; "))
			} else {
				fmt.Fprintln(tw, r.Row())
			}
			fmt.Fprintf(os.Stderr, "done: K=%d %s\n", k, mode)
			for i := range n {
				rc.Admin(i).FlushAll(context.Background())
			}
		}
	}
	return nil
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
