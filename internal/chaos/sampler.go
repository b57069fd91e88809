package chaos

import (
	"context"
	_ "embed"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

//go:embed sample.lua
var sampleLua string

var sampleScript = redis.NewScript(sampleLua)

// sampler watches for keys of released locks: every period it reads every
// lock key on every node directly (through Admin, bypassing the proxies
// and their faults), and records each key that holds the token of a lock
// whose Unlock had returned before the read was sent. The checker decides
// which of these sightings are keys that came back (see Check).
type sampler struct {
	e      *env
	period time.Duration
	stop   chan struct{}
	wg     sync.WaitGroup

	reads, failed atomic.Int64
	// lateMax is the longest a 10ms sleep of the probe goroutine overslept
	// (ns): how late this process ran a goroutine whose timer was due.
	lateMax atomic.Int64
}

// schedProbe measures the process's scheduling delay while the profile
// runs: it sleeps 10ms at a time and records the longest oversleep. A
// Lock's loss is reported by a timer at its ValidUntil, and the worker
// that sees it is a goroutine too: on a loaded machine both run late by
// this much (220ms once, in the full suite beside stress-ng at load 15),
// which no library can avoid. The checker's slack for late loss reports
// adds it (see Run).
func (s *sampler) schedProbe() {
	const step = 10 * time.Millisecond
	for {
		before := time.Now()
		select {
		case <-s.stop:
			return
		case <-time.After(step):
		}
		if late := int64(time.Since(before) - step); late > s.lateMax.Load() {
			s.lateMax.Store(late)
		}
	}
}

// startSampler starts one sampling goroutine per node, so that a paused
// node holds up only its own reads.
func startSampler(e *env) *sampler {
	s := &sampler{e: e, period: max(e.cfg.TTL/10, 5*time.Millisecond), stop: make(chan struct{})}
	s.wg.Go(s.schedProbe)
	for i := range e.cfg.Nodes {
		s.wg.Go(func() {
			t := time.NewTicker(s.period)
			defer t.Stop()
			for {
				select {
				case <-s.stop:
					return
				case <-t.C:
					s.read(i)
				}
			}
		})
	}
	return s
}

// close stops the sampling goroutines, waits for them, and reads every
// node once more.
func (s *sampler) close() {
	close(s.stop)
	s.wg.Wait()
	for i := range s.e.cfg.Nodes {
		s.read(i)
	}
}

// read reads node i once and records the sightings. A read that fails (a
// node killed or paused) is counted and skipped.
func (s *sampler) read(i int) {
	ttl := s.e.cfg.TTL
	ctx, cancel := context.WithTimeout(context.Background(), max(ttl/5, 100*time.Millisecond))
	defer cancel()
	at := time.Now()
	vals, err := sampleScript.Run(ctx, s.e.cluster.Admin(i), nil, "lock:*", scripts.GuardSuffix).Slice()
	if err != nil {
		s.failed.Add(1)
		return
	}
	s.reads.Add(1)
	for j := 0; j+1 < len(vals); j += 2 {
		v, _ := vals[j].(string)
		pttl, ok := vals[j+1].(int64)
		if !ok || pttl < 0 {
			continue
		}
		hold, released, ok := s.e.releasedAt(v)
		if !ok || !at.After(released) {
			continue // held, or released after the read was sent
		}
		s.e.hist.sighting(Sighting{Hold: hold, Node: i, At: at, Age: ttl - time.Duration(pttl)*time.Millisecond})
	}
}

// SamplerStats says how often the sampler read the nodes.
type SamplerStats struct {
	Period time.Duration `json:"period_ns"`
	Reads  int64         `json:"reads"`
	Failed int64         `json:"failed_reads"` // a node down or paused
	// SchedDelay is the longest the process ran a due timer late while
	// the profile ran (schedProbe).
	SchedDelay time.Duration `json:"sched_delay_ns"`
}

func (s *sampler) stats() SamplerStats {
	return SamplerStats{Period: s.period, Reads: s.reads.Load(), Failed: s.failed.Load(), SchedDelay: time.Duration(s.lateMax.Load())}
}
