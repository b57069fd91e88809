package main

import (
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
)

// PoolCost is what go-redis connection pools did per operation: how often
// a request waited for a connection (the pool was full) and how long, how
// often a pool had to dial (a miss) and how often a wait timed out.
type PoolCost struct {
	Waits    float64 `json:"waits"`
	WaitUS   float64 `json:"wait_us"`
	Dials    float64 `json:"dials"`
	Timeouts float64 `json:"timeouts"`
}

// poolStats sums the pool statistics of node clients.
func poolStats(cs []redis.UniversalClient) redis.PoolStats {
	var t redis.PoolStats
	for _, c := range cs {
		s := c.PoolStats()
		if s == nil {
			continue
		}
		t.WaitCount += s.WaitCount
		t.WaitDurationNs += s.WaitDurationNs
		t.Misses += s.Misses
		t.Timeouts += s.Timeouts
	}
	return t
}

// poolPerOp returns the difference of two poolStats readings per
// operation.
func poolPerOp(before, after redis.PoolStats, ops int) *PoolCost {
	n := float64(ops)
	return &PoolCost{
		Waits:    float64(after.WaitCount-before.WaitCount) / n,
		WaitUS:   float64(after.WaitDurationNs-before.WaitDurationNs) / 1e3 / n,
		Dials:    float64(after.Misses-before.Misses) / n,
		Timeouts: float64(after.Timeouts-before.Timeouts) / n,
	}
}

// medianPool takes the median of each field over the runs.
func medianPool(ps []PoolCost) *PoolCost {
	col := func(f func(PoolCost) float64) float64 {
		xs := make([]float64, len(ps))
		for i, p := range ps {
			xs[i] = f(p)
		}
		return medianFloat(xs)
	}
	return &PoolCost{
		Waits:    col(func(p PoolCost) float64 { return p.Waits }),
		WaitUS:   col(func(p PoolCost) float64 { return p.WaitUS }),
		Dials:    col(func(p PoolCost) float64 { return p.Dials }),
		Timeouts: col(func(p PoolCost) float64 { return p.Timeouts }),
	}
}

// nodeClientsOf returns the node clients lks use: each instance's own
// (ownedNodes), else ns, which they share.
func nodeClientsOf(lks []libs.Locker, ns []redis.UniversalClient) []redis.UniversalClient {
	var out []redis.UniversalClient
	for _, l := range lks {
		if o, ok := l.(ownedNodes); ok {
			out = append(out, o.nodes...)
		}
	}
	if out == nil {
		return ns
	}
	return out
}
