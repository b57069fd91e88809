package sim

import (
	"strings"
	"sync/atomic"
	"testing"
)

var upChunks, evals, times atomic.Int64

func countUp(b []byte) {
	upChunks.Add(1)
	s := strings.ToLower(string(b))
	evals.Add(int64(strings.Count(s, "evalsha")))
	times.Add(int64(strings.Count(s, "\r\ntime\r\n")))
}

func TestCount(t *testing.T) {
	hookUp = countUp
	defer func() { hookUp = nil }()
	for s := uint64(1); s <= 10; s++ {
		res := runSeed(t, NewPlan(s))
		t.Logf("seed %d: holds %d, goroutines %d (bound %d), chunks %d, evals %d, time %d", s, res.Holds, res.Goroutines, goroutineBound(res.Plan, res.Plan.Clients+1), upChunks.Swap(0), evals.Swap(0), times.Swap(0))
	}
}
