package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// Config is one run of one profile.
type Config struct {
	Nodes     int           // redis-server nodes; default 5
	Clients   int           // lock clients, each with its own redlock.Client; default 8
	Resources int           // resources they contend for; default 4
	TTL       time.Duration // lock TTL; default 1s
	Duration  time.Duration // how long the clients run; profiles raise it to their minimum
	Seed      uint64        // seeds every random choice of the run
	// HoldMin and HoldMax bound a critical section; defaults 0 and 1.5×TTL.
	HoldMin, HoldMax time.Duration
	// Fenced makes the register refuse stale tokens; profiles set it.
	Fenced bool
	// WaitBound, when set, is the longest a release may be followed by no
	// hold of its resource while a client waits in Lock on it (see
	// CheckOptions.WaitBound); profiles set it.
	WaitBound time.Duration
	// RW makes the workers take read-write locks, readers:writers 9:1
	// (readers do not write to the register); profiles set it.
	RW      bool
	Weights Weights // minority nemesis; default DefaultWeights
	// Logf receives the harness's diagnostics; default none.
	Logf func(format string, args ...any)
}

func (c Config) withDefaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 5
	}
	if c.Clients == 0 {
		c.Clients = 8
	}
	if c.Resources == 0 {
		c.Resources = 4
	}
	if c.TTL == 0 {
		c.TTL = time.Second
	}
	if c.HoldMax == 0 {
		c.HoldMax = c.TTL * 3 / 2
	}
	if c.Weights == (Weights{}) {
		c.Weights = DefaultWeights
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

// Profile is one fault scenario and what it must show.
type Profile struct {
	Name string
	// Safe profiles must report 0 violations; the others are negative
	// controls, which must report at least one, to show the checker sees.
	Safe  bool
	About string
	// Share is the profile's part of a total duration (see Plan).
	Share float64
	// MinTTLs is the shortest useful run, in TTLs.
	MinTTLs int
	adjust  func(*Config)
	run     func(ctx context.Context, e *env) error
}

// Profiles returns every profile, safe ones first.
func Profiles() []Profile {
	ps := []Profile{
		{
			Name: "minority", Safe: true, Share: 0.4, MinTTLs: 4,
			About:  "C clients × R resources, fenced register; the nemesis pauses (SIGSTOP), kills and restarts after the TTL, slows, cuts and resets at most 2 of 5 nodes at a time, and pauses holders past their TTL",
			adjust: func(c *Config) { c.Fenced = true },
			run: func(ctx context.Context, e *env) error {
				return runWorkers(ctx, e, func(ctx context.Context, n *nemesis) { n.minority(ctx) })
			},
		},
		{
			Name: "majority-loss", Safe: true, Share: 0.2, MinTTLs: 4,
			About: "long holds; the nemesis pauses, cuts, or kills (restart after the TTL) 3 of 5 nodes at once: every lock held then must be reported lost by its ValidUntil, and no two holds may overlap once the nodes are back",
			adjust: func(c *Config) {
				c.Fenced = true
				// Holds outlast every event: they end by loss.
				c.HoldMin, c.HoldMax = 8*c.TTL, 10*c.TTL
			},
			run: func(ctx context.Context, e *env) error {
				return runWorkers(ctx, e, func(ctx context.Context, n *nemesis) { n.majority(ctx) })
			},
		},
		{
			Name: "late-requests", Safe: true, Share: 0.2, MinTTLs: 6,
			About:  "requests land late: short latency bursts on one node hold what it reads for 1.5–4× the node timeout, one in three followed at once by a pause of that node for 2.2–3×TTL with the held requests in its socket, raw subscribers listen on every Client's wake-up channel, and a node is killed while clients wait in Lock and restarted empty after the TTL (sometimes paused at once); no key of a released lock may come back, and Lock must return only valid locks",
			adjust: func(c *Config) { c.Fenced = true },
			run: func(ctx context.Context, e *env) error {
				return runWorkers(ctx, e, func(ctx context.Context, n *nemesis) { n.late(ctx, true) })
			},
		},
		{
			Name: "rwlock", Safe: true, Share: 0.15, MinTTLs: 4,
			About:  "read-write locks, readers:writers 9:1, fenced register written by writers only; the minority nemesis (pauses, kills and restarts, latency, cuts, resets of at most 2 of 5 nodes, holders paused past their TTL): no writer may hold with a reader or another writer",
			adjust: func(c *Config) { c.Fenced, c.RW = true, true },
			run: func(ctx context.Context, e *env) error {
				return runWorkers(ctx, e, func(ctx context.Context, n *nemesis) { n.minority(ctx) })
			},
		},
		frozenProfile(),
		{
			Name: "pause-fenced", Safe: true, Share: 0.05,
			About:  "a holder pauses past its TTL, another client takes the lock and writes, the first wakes and writes with its old token: the fenced register must refuse it",
			adjust: func(c *Config) { c.Fenced = true },
			run:    runPause,
		},
		{
			Name: "restart-no-delay", Safe: false, Share: 0.05, MinTTLs: 6,
			About:  "negative: a holder owns exactly 3 of 5 nodes (2 cut during its acquire), one of the 3 restarts empty at once, another client takes a majority: overlapping holds",
			adjust: func(c *Config) { c.Fenced = true },
			run:    runRestartNoDelay,
		},
		{
			Name: "release-unguarded", Safe: false, Share: 0.05, MinTTLs: 6,
			About:  "negative: releases leave no guard and requests carry no not-after bound (testhooks.SkipReleaseGuard, SkipNotAfter); a latency spike on one node holds a holder's acquire there for 4× the node timeout, the holder unlocks at once, its release overtakes the acquire: the acquire sets the released key again",
			adjust: func(c *Config) { c.Fenced = true },
			run: func(ctx context.Context, e *env) error {
				return runUnguarded(ctx, e, &testhooks.SkipReleaseGuard, &testhooks.SkipNotAfter)
			},
		},
		{
			Name: "late-unbounded", Safe: false, Share: 0.05, MinTTLs: 6,
			About:  "negative: requests carry no not-after bound (testhooks.SkipNotAfter) while the release guard stays as short as the bounds allow (a node timeout and the clock error); the release-unguarded scenario: the acquire held 4× the node timeout lands after the guard expired and sets the released key again",
			adjust: func(c *Config) { c.Fenced = true },
			run: func(ctx context.Context, e *env) error {
				return runUnguarded(ctx, e, &testhooks.SkipNotAfter)
			},
		},
		{
			Name: "rwlock-reader-ignores-writer", Safe: false, Share: 0.05, MinTTLs: 5,
			About: "negative: the rwlock profile without faults, with a reader script that grants beside a writer (testhooks.ReaderIgnoresWriter): a reader holds with a writer",
			adjust: func(c *Config) {
				c.Fenced, c.RW = true, true
				// A TTL of at least 1.5s: with 500ms (node timeout 50ms)
				// beside stress-ng the run made 3 acquisitions in 3.2s
				// and showed nothing.
				c.TTL = max(c.TTL, 1500*time.Millisecond)
				// Long writer holds, so that readers arrive meanwhile.
				c.HoldMin = c.TTL / 2
			},
			run: func(ctx context.Context, e *env) error {
				testhooks.ReaderIgnoresWriter.Store(true)
				defer testhooks.ReaderIgnoresWriter.Store(false)
				return runWorkers(ctx, e, func(ctx context.Context, n *nemesis) { <-ctx.Done() })
			},
		},
		{
			Name: "pause-unfenced", Safe: false, Share: 0.05, MinTTLs: 4,
			About:  "negative: pause-fenced with a register that ignores tokens: the paused holder's write is applied after the takeover",
			adjust: func(c *Config) { c.Fenced = false },
			run:    runPause,
		},
	}
	ps = append(ps, semaphoreProfiles()...)
	// Safe ones first.
	slices.SortStableFunc(ps, func(a, b Profile) int {
		switch {
		case a.Safe == b.Safe:
			return 0
		case a.Safe:
			return -1
		}
		return 1
	})
	return ps
}

// Plan splits a total duration among profiles by their shares.
func Plan(profiles []Profile, total time.Duration) []time.Duration {
	var sum float64
	for _, p := range profiles {
		sum += p.Share
	}
	out := make([]time.Duration, len(profiles))
	for i, p := range profiles {
		out[i] = time.Duration(float64(total) * p.Share / sum)
	}
	return out
}

// Outcome is the result of one profile run.
type Outcome struct {
	Profile   string        `json:"profile"`
	Safe      bool          `json:"safe"`
	About     string        `json:"about"`
	Seed      uint64        `json:"seed"`
	Nodes     int           `json:"nodes"`
	Clients   int           `json:"clients"`
	Resources int           `json:"resources"`
	TTL       time.Duration `json:"ttl_ns"`
	// WaitBound is the liveness bound the handovers were checked against
	// (CheckOptions.WaitBound, with the slack); zero when not checked.
	WaitBound time.Duration `json:"wait_bound_ns,omitempty"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	Result    Result        `json:"result"`
	// KeysLeft are the lock keys still on the nodes after every client
	// was closed and every fault undone.
	KeysLeft Leftovers `json:"keys_left"`
	// Sampler says how often the nodes were read for keys of released
	// locks; WakeUps counts the messages the raw subscribers received
	// (profiles with workers).
	Sampler SamplerStats `json:"sampler"`
	WakeUps int64        `json:"wake_up_messages"`
	// HarnessErrors are failures of the harness itself (a node that did not
	// restart, say); they make the outcome fail.
	HarnessErrors []string `json:"harness_errors,omitempty"`
}

// Pass reports whether the profile showed what it must: 0 violations for a
// safe profile, at least one for a negative control, and no harness error.
func (o Outcome) Pass() bool {
	if len(o.HarnessErrors) > 0 {
		return false
	}
	if o.Safe {
		return o.Result.Violations() == 0
	}
	return o.Result.Violations() > 0
}

// Run runs profile p on a fresh cluster of real redis-server processes, then
// checks its history. It returns redistest.ErrNoRedisServer when
// redis-server is not on PATH.
func Run(ctx context.Context, p Profile, cfg Config) (Outcome, error) {
	cfg = cfg.withDefaults()
	if p.adjust != nil {
		p.adjust(&cfg)
	}
	cfg.Duration = max(cfg.Duration, time.Duration(p.MinTTLs)*cfg.TTL)
	out := Outcome{Profile: p.Name, Safe: p.Safe, About: p.About, Seed: cfg.Seed,
		Nodes: cfg.Nodes, Clients: cfg.Clients, Resources: cfg.Resources, TTL: cfg.TTL}
	if p.adjust != nil {
		out.Resources, out.TTL = cfg.Resources, cfg.TTL
	}
	start := time.Now()
	cluster, err := redistest.StartCluster(cfg.Nodes, redistest.WithLogf(cfg.Logf))
	if err != nil {
		return out, err
	}
	hist := NewHistory()
	e := &env{cfg: cfg, cluster: cluster, hist: hist, reg: NewRegister(hist, cfg.Fenced), logf: cfg.Logf}
	var errs []error
	smp := startSampler(e)
	if err := p.run(ctx, e); err != nil {
		errs = append(errs, err)
	}
	smp.close()
	out.Sampler = smp.stats()
	out.WakeUps = e.wakeUps.Load()
	left, err := keysLeft(e)
	if err != nil {
		errs = append(errs, fmt.Errorf("scanning for keys left: %w", err))
	}
	out.KeysLeft = left
	errs = append(errs, cluster.Err())
	if err := cluster.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		out.HarnessErrors = append(out.HarnessErrors, err.Error())
	}
	// The slack: a third of the TTL (at least 100ms), plus how late this
	// process ran a due timer meanwhile (the loss timer and the worker
	// that sees it run no earlier: schedProbe).
	slack := max(100*time.Millisecond, cfg.TTL/3) + out.Sampler.SchedDelay
	wait := time.Duration(0)
	if cfg.WaitBound > 0 {
		wait = cfg.WaitBound + slack
	}
	out.WaitBound = wait
	// A node that was unreachable or slowed may get our release late: a
	// request it held that runs when it comes back is past its not-after
	// bound (doc.go), but until the release lands another client's release
	// may hand the key to our finished token for one reservation (see
	// CheckOptions.Unreachable): one TTL covers it and the time the Client
	// holds requests back from a stuck node (at most a second).
	out.Result = Check(hist.Snapshot(), CheckOptions{Slack: slack, Persist: cfg.TTL / 2, Unreachable: cfg.TTL + time.Second, WaitBound: wait})
	if n := out.Result.FailedLocks[outcomeAlreadyHeld]; n > 0 {
		out.HarnessErrors = append(out.HarnessErrors, fmt.Sprintf("%d lock calls returned ErrAlreadyHeld, which no worker can cause (none calls under a lock's ctx): the worker or the library's holder check is wrong", n))
	}
	out.Elapsed = time.Since(start)
	return out, nil
}

// runWorkers runs the clients for the configured duration while nem injects
// faults, then stops the clients first (so that no acquisition happens while
// a fault is cut short) and the nemesis second, and closes every client.
func runWorkers(ctx context.Context, e *env, nem func(context.Context, *nemesis)) error {
	workers, err := newWorkers(e, e.cfg.Clients)
	if err != nil {
		return err
	}
	return runLoops(ctx, e, workers, nem, func(ctx context.Context, w *worker) { w.loop(ctx) })
}

// runLoops is runWorkers with workers made and loop for the workers' life.
func runLoops(ctx context.Context, e *env, workers []*worker, nem func(context.Context, *nemesis), loop func(context.Context, *worker)) error {
	subs := startSubscribers(e)
	defer subs.close()
	n := newNemesis(e, workers)
	nctx, ncancel := context.WithCancel(ctx)
	var ndone sync.WaitGroup
	ndone.Go(func() { nem(nctx, n) })

	wctx, wcancel := context.WithTimeout(ctx, e.cfg.Duration)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { loop(wctx, w) })
	}
	wg.Wait()
	wcancel()
	ncancel()
	ndone.Wait()
	return closeWorkers(workers)
}

func newWorkers(e *env, n int) ([]*worker, error) {
	var ws []*worker
	for i := range n {
		w, err := newWorker(e, i)
		if err != nil {
			closeWorkers(ws)
			return nil, err
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func closeWorkers(ws []*worker) error {
	var errs []error
	for _, w := range ws {
		if err := w.close(); err != nil {
			errs = append(errs, fmt.Errorf("client %d: Close: %w", w.id, err))
		}
	}
	return errors.Join(errs...)
}

// runPause is the client-pause scenario, scripted so that it happens every
// time: A locks and writes, then pauses for 2×TTL (renewals held at its
// gate); B's Lock call, waiting meanwhile, gets the lock once A's keys have
// expired, and writes; A wakes, still believing it holds the lock, and
// writes with its old token. The register (fenced or not, per profile)
// decides. Repeated, on a new resource each time, for the duration.
func runPause(ctx context.Context, e *env) error {
	ws, err := newWorkers(e, 2)
	if err != nil {
		return err
	}
	a, b := ws[0], ws[1]
	ttl := e.cfg.TTL
	end := time.Now().Add(e.cfg.Duration)
	for it := 0; it == 0 || (time.Now().Before(end) && ctx.Err() == nil); it++ {
		res := "pause" + strconv.Itoa(it)
		ha, err := a.lock(ctx, res, false)
		if err != nil {
			e.logf("chaos: pause %d: A: %v", it, err)
			continue
		}
		ha.write(false)
		var wg sync.WaitGroup
		wrote := make(chan struct{})
		wg.Go(func() {
			// B starts waiting while A is paused.
			time.Sleep(ttl / 10)
			lctx, cancel := context.WithTimeout(ctx, 4*ttl)
			hb, err := b.lock(lctx, res, false)
			cancel()
			if err != nil {
				e.logf("chaos: pause %d: B: %v", it, err)
				return
			}
			hb.write(false)
			select {
			case <-wrote:
			case <-time.After(4 * ttl):
			}
			if hb.l.Valid() {
				hb.write(false)
			}
			hb.unlock()
		})
		ha.pause(ctx, 2*ttl, 3*ttl)
		close(wrote)
		ha.unlock()
		wg.Wait()
	}
	return closeWorkers(ws)
}

// runUnguarded is the negative control of the check that no key of a
// released lock reappears, scripted so that it happens every time: with the
// safety steps named by off turned off (the release guard, the not-after
// bounds, or both), A's TryLock runs while node j's proxy holds what it
// reads for 4× the node timeout (a latency spike), so A gets the lock from
// the other nodes while its acquire is still on its way to j; A unlocks at
// once, and its release, sent once the acquire has timed out and after the
// spike, reaches j first; the late acquire then finds the key free and sets
// it for a whole TTL. The sampler must see it. Repeated, on a new resource
// each time, for the duration.
func runUnguarded(ctx context.Context, e *env, off ...*atomic.Bool) error {
	for _, h := range off {
		h.Store(true)
		defer h.Store(false)
	}
	ws, err := newWorkers(e, 1)
	if err != nil {
		return err
	}
	a := ws[0]
	c := e.cluster
	ttl := e.cfg.TTL
	j := e.rand(9).IntN(e.cfg.Nodes)
	end := time.Now().Add(e.cfg.Duration)
	// First a lock granted by j, which loads the acquire script there: a
	// late EVALSHA that finds no script does nothing (the NOSCRIPT fallback
	// to EVAL comes from the caller, which has stopped waiting).
	for time.Now().Before(end) && ctx.Err() == nil {
		h, err := a.lock(ctx, "unguarded", true)
		if err != nil {
			continue
		}
		v, _ := c.Admin(j).Get(ctx, "lock:unguarded").Result()
		h.unlock()
		if v == h.l.Token() {
			break
		}
	}
	for it := 0; it == 0 || (time.Now().Before(end) && ctx.Err() == nil); it++ {
		res := "unguarded" + strconv.Itoa(it)
		start := time.Now()
		c.SetLatency(j, 4*nodeTimeout(ttl))
		ha, err := a.lock(ctx, res, true)
		c.SetLatency(j, 0)
		e.hist.fault(Fault{Kind: KindSpike, Nodes: []int{j}, Client: -1, Start: start, End: time.Now()})
		if err != nil {
			e.logf("chaos: release-unguarded %d: A: %v", it, err)
			continue
		}
		ha.write(false)
		ha.unlock()
		// The late acquire lands, and its key lives a TTL.
		sleepCtx(ctx, ttl)
	}
	return closeWorkers(ws)
}

// runRestartNoDelay breaks Redlock's assumption on purpose: A acquires while
// 2 of 5 nodes are cut, so it holds exactly 3; the cut is healed; one of A's
// 3 nodes restarts empty at once, before A's first renewal could copy its
// key to the healed nodes; B then takes that node and the 2 healed ones, a
// majority, while A still believes it holds the lock. Both write. Repeated,
// on a new resource each time, for the duration.
func runRestartNoDelay(ctx context.Context, e *env) error {
	ws, err := newWorkers(e, 2)
	if err != nil {
		return err
	}
	a, b := ws[0], ws[1]
	c := e.cluster
	n := e.cfg.Nodes
	minority := n - (n/2 + 1)
	rng := e.rand(7)
	end := time.Now().Add(e.cfg.Duration)
	for it := 0; it == 0 || (time.Now().Before(end) && ctx.Err() == nil); it++ {
		res := "nodelay" + strconv.Itoa(it)
		perm := rng.Perm(n)
		cut, victim := perm[:minority], perm[minority]
		start := time.Now()
		for _, i := range cut {
			c.Cut(i)
		}
		ha, err := a.lock(ctx, res, true)
		for _, i := range cut {
			c.Heal(i)
		}
		e.hist.fault(Fault{Kind: KindCut, Nodes: cut, Client: -1, Start: start, End: time.Now()})
		if err != nil {
			e.logf("chaos: restart-no-delay %d: A: %v", it, err)
			continue
		}
		ha.write(false)
		start = time.Now()
		c.Restart(victim)
		e.hist.fault(Fault{Kind: KindRestartNoDelay, Nodes: []int{victim}, Client: -1, Start: start, End: time.Now()})
		hb, err := b.lock(ctx, res, true)
		if err != nil {
			e.logf("chaos: restart-no-delay %d: B: %v", it, err)
		} else {
			hb.write(false)
		}
		if ha.l.Valid() {
			ha.write(false) // A still believes it holds the lock
		}
		// A's next renewal finds a majority not ours and reports the loss.
		select {
		case <-ha.l.Lost():
		case <-time.After(e.cfg.TTL):
		}
		ha.unlock()
		if hb != nil {
			hb.unlock()
		}
	}
	return closeWorkers(ws)
}
