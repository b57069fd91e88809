// Command chaos runs the fault-injection checker's profiles against real
// redis-server nodes and prints what the checker found: acquisitions,
// faults injected by kind, overlapping holds, stale writes applied and
// refused, lost-lock reports and their timing, locks Lock returned not
// valid, keys of released locks that came back, keys left behind.
//
//	go run ./internal/chaos/cmd/chaos -duration 5m -clients 8 -resources 4 -seed 1
//
// -duration is split among the profiles (see chaos.Plan). It exits with
// status 1 if a safe profile reports a violation or a negative control
// reports none, and 2 on a usage or setup error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/chaos"
	"github.com/quorumlock/quorumlock/internal/redistest"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func main() {
	chaos.RunChildIfAsked() // the frozen-waiter profile's child process
	var (
		duration  = flag.Duration("duration", time.Minute, "total run time, split among the profiles")
		clients   = flag.Int("clients", 8, "lock clients, each with its own redlock.Client")
		resources = flag.Int("resources", 4, "resources the clients contend for")
		ttl       = flag.Duration("ttl", time.Second, "lock TTL")
		seed      = flag.Uint64("seed", 0, "seed of every random choice (0: from the clock)")
		only      = flag.String("profiles", "", "comma-separated profiles to run (default all)")
		jsonOut   = flag.String("json", "", "also write the outcomes as JSON to this file (- for stdout)")
		verbose   = flag.Bool("v", false, "log the harness's diagnostics to stderr")
	)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("chaos: ")
	redis.SetLogger(quietLogger{})

	profiles := chaos.Profiles()
	if *only != "" {
		want := strings.Split(*only, ",")
		profiles = slices.DeleteFunc(profiles, func(p chaos.Profile) bool { return !slices.Contains(want, p.Name) })
		if len(profiles) == 0 {
			log.Printf("no profile named %q", *only)
			os.Exit(2)
		}
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	logf := func(string, ...any) {}
	if *verbose {
		logf = log.Printf
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fmt.Printf("quorumlock chaos: seed %d, %d profiles, %v in total, %d CPUs, %s/%s\n\n",
		*seed, len(profiles), *duration, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	goroutines := runtime.NumGoroutine()
	plan := chaos.Plan(profiles, *duration)
	var outcomes []chaos.Outcome
	failed := false
	for i, p := range profiles {
		cfg := chaos.Config{Clients: *clients, Resources: *resources, TTL: *ttl, Duration: plan[i], Seed: *seed, Logf: logf}
		out, err := chaos.Run(ctx, p, cfg)
		if errors.Is(err, redistest.ErrNoRedisServer) {
			log.Print(err)
			os.Exit(2)
		}
		if err != nil {
			log.Printf("%s: %v", p.Name, err)
			os.Exit(2)
		}
		outcomes = append(outcomes, out)
		chaos.WriteOutcome(os.Stdout, out)
		fmt.Println()
		failed = failed || !out.Pass()
		if ctx.Err() != nil {
			break
		}
	}
	// Every goroutine of the runs must be gone: clients closed, proxies
	// and reapers stopped. Give the runtime a moment to reap exiting ones.
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("goroutines: %d before the runs, %d after\n", goroutines, runtime.NumGoroutine())
	pass := 0
	for _, o := range outcomes {
		if o.Pass() {
			pass++
		}
	}
	fmt.Printf("%d of %d profiles passed\n", pass, len(outcomes))

	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, outcomes); err != nil {
			log.Print(err)
			os.Exit(2)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// writeJSON writes outcomes to path, or to stdout for "-".
func writeJSON(path string, outcomes []chaos.Outcome) error {
	b, err := json.MarshalIndent(outcomes, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
