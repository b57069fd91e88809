package main

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// TestMeasure_overhead measures what qlock run adds to running a command
// directly: the p50 of 20 runs (or QUORUMLOCK_QLOCK_RUNS) of `true`, both
// ways, interleaved, on 3 local nodes reached without the test proxies:
//
//	QUORUMLOCK_QLOCK_RUNS=20 go test -count=1 -v -run TestMeasure_overhead ./cmd/qlock
func TestMeasure_overhead(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("QUORUMLOCK_QLOCK_RUNS"))
	if err != nil || n <= 0 {
		t.Skip("set QUORUMLOCK_QLOCK_RUNS to the number of runs")
	}
	rc := redistest.Start(t, 3)
	var urls []string
	for i := range rc.N() {
		urls = append(urls, "redis://"+rc.ServerAddr(i))
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	timed := func(name string, args ...string) time.Duration {
		cmd := exec.Command(name, args...)
		start := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return time.Since(start)
	}
	var direct, locked []time.Duration
	for range n {
		direct = append(direct, timed(truePath))
		locked = append(locked, timed(qlockBin, "run", "-nodes", strings.Join(urls, ","), "overhead", "--", truePath))
	}
	slices.Sort(direct)
	slices.Sort(locked)
	p50 := func(ds []time.Duration) time.Duration { return ds[len(ds)/2] }
	t.Logf("%d runs of true, 3 local nodes: direct p50 %v; qlock run p50 %v (min %v, max %v); overhead p50 %v",
		n, p50(direct), p50(locked), locked[0], locked[len(locked)-1], p50(locked)-p50(direct))
}
