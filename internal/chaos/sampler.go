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
	// lateMax is the longest a probe chain's 10ms timer overslept before
	// the goroutine it woke ran (ns): how late this process ran a timer's
	// function and the goroutine it woke (schedProbe).
	lateMax atomic.Int64
}

// schedProbe measures the process's scheduling delay while the profile
// runs, along the path a loss report takes: a timer fires on one goroutine
// (the renewal scheduler's deadline event), which wakes a second (the
// worker watching Lost(), or the OnLost callback). It runs probeChains
// such chains at once, each a 10ms timer whose function closes a channel
// that the chain's goroutine waits on, and records the longest oversleep.
// On a loaded machine both steps of a report run late by this much (220ms
// once, in the full suite beside stress-ng at load 15), which no library
// can avoid. The checker's slack for late loss reports adds it (see Run).
//
// One goroutine sleeping 10ms at a time measured the first step only: a
// report came 430ms after ValidUntil against a slack of 267ms, 101ms of it
// this probe's (.ci/stress run 3 on 7a9d7b4); with the scheduler's timer
// instrumented, beside stress-ng and a race-built redlock suite (load
// 7–8.5), its timer fired up to 246ms late while that probe saw 208ms, and
// one loss's bookkeeping once took 60ms (a mutex's holder descheduled):
// the steps of one report are late by more than one sleep's worst case.
func (s *sampler) schedProbe() {
	const step = 10 * time.Millisecond
	for {
		before := time.Now()
		fired := make(chan struct{})
		t := time.AfterFunc(step, func() { close(fired) })
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-fired:
		}
		late := int64(time.Since(before) - step)
		for cur := s.lateMax.Load(); late > cur; cur = s.lateMax.Load() {
			if s.lateMax.CompareAndSwap(cur, late) { // the chains race to raise it
				break
			}
		}
	}
}

// probeChains is how many schedProbe chains run at once: more samples of
// the delay, on whichever of the runtime's threads their timers land.
const probeChains = 4

// startSampler starts one sampling goroutine per node, so that a paused
// node holds up only its own reads.
func startSampler(e *env) *sampler {
	s := &sampler{e: e, period: max(e.cfg.TTL/10, 5*time.Millisecond), stop: make(chan struct{})}
	for range probeChains {
		s.wg.Go(s.schedProbe)
	}
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
	// SchedDelay is the longest the process ran a due timer, and the
	// goroutine it woke, late while the profile ran (schedProbe).
	SchedDelay time.Duration `json:"sched_delay_ns"`
}

func (s *sampler) stats() SamplerStats {
	return SamplerStats{Period: s.period, Reads: s.reads.Load(), Failed: s.failed.Load(), SchedDelay: time.Duration(s.lateMax.Load())}
}
