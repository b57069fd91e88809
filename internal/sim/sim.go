package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

// Profile is one synchronizer's workload and its own invariants. The lock
// profile (LockProfile) is the first; a read-write lock or a semaphore
// adds its own: Start launches its goroutines on the Env (they must
// return once env.Done() is closed), Check records its violations with
// env.History.Violate after the run. The invariants every profile shares
// (no goroutine outlives Close, the fault plan) are the simulator's.
type Profile interface {
	Name() string
	Start(env *Env)
	Check(env *Env)
}

// quietNeeder is a profile whose liveness check needs a quiet phase longer
// than the plan's: Run lengthens it to quiet(p).
type quietNeeder interface {
	quiet(p Plan) time.Duration
}

// Env is what a profile acts on: the Clients (one per simulated process,
// each over its own node clients through the fault layer), the plan, the
// history, and the run's clock.
type Env struct {
	Plan    Plan
	Clients []*redlock.Client
	History *History
	cl      *cluster
	start   time.Time
	ctx     context.Context
	wg      sync.WaitGroup
	faults  *faultLog
	res     *residue
	gx      atomic.Pointer[gxEpisode] // the expired-grant episode (expired.go)
	lh      *lateHandoff              // the late-handoff episode (latehandoff.go), nil if none
}

// Go runs fn on a goroutine that the run waits for before its checks.
func (e *Env) Go(fn func()) { e.wg.Go(fn) }

// Done is closed when the run's time is up.
func (e *Env) Done() <-chan struct{} { return e.ctx.Done() }

// Ctx is the run's context: cancelled when its time is up.
func (e *Env) Ctx() context.Context { return e.ctx }

// At is the instant d after the run's start.
func (e *Env) At(d time.Duration) time.Time { return e.start.Add(d) }

// SleepUntil sleeps until t or the run's end; false at the end.
func (e *Env) SleepUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return e.ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-e.ctx.Done():
		return false
	}
}

// Rand returns a generator for one goroutine of the run, drawn from the
// seed and the goroutine's name: its draws do not depend on other
// goroutines.
func (e *Env) Rand(name string) *rand.Rand {
	var h uint64 = 14695981039346656037
	for _, b := range []byte(name) {
		h = (h ^ uint64(b)) * 1099511628211
	}
	return rand.New(rand.NewPCG(e.Plan.Seed, h))
}

// Result is the outcome of one run.
type Result struct {
	Plan       Plan
	Violations []Violation
	Holds      int
	Terms      int    // the election profile's terms
	Goroutines int    // in the bubble at the end of the quiet phase
	Report     string // the compact history (events and violations)
}

// Failed reports whether the run broke an invariant.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

// Run runs plan p with the profiles (the lock profile when none) and
// checks it. It must run inside a testing/synctest bubble: the nodes, the
// fault layer and the Clients all use the bubble's fake clock, and the
// run ends by checking that no goroutine of the library outlived Close.
func Run(p Plan, profiles ...Profile) Result {
	if len(profiles) == 0 {
		profiles = []Profile{&LockProfile{}}
	}
	if len(profiles) != 1 || profiles[0].Name() != "lock" {
		p.NoFence = nil
		p.TieBursts = 0
		p.FenceDrop = nil
		p.Handoff = nil
		p.YieldKeep = false
		p.CloseAt = 0
		p.GrantExpired = false
		p.LateHandoff = false
		p.GuardEpisode = nil
		if p.LongHold != nil {
			// The long hold is the lock profile's, and so is the longer
			// settling after its cut: the other profiles' seeds keep
			// their length (CPU: the 500 seeds' minute).
			if p.LongHold.SlowReply > 0 {
				p.Settle -= slowReplySettle
			}
			p.LongHold = nil
			p.Settle -= longHoldSettle
		}
	}
	if len(profiles) != 1 || profiles[0].Name() != "semaphore" {
		p.SemK = 0
	}
	for _, pr := range profiles {
		if q, ok := pr.(quietNeeder); ok {
			p.Quiet = max(p.Quiet, q.quiet(p))
		}
	}
	clients := p.Clients
	if p.FrozenWaiter {
		clients++
	}
	if p.YieldKeep {
		clients++ // the yielder (aimed.go yieldEpisode)
	}
	if p.SubClose {
		clients++ // the subscribe-close episode's Client (subclose.go)
	}
	subClient := clients - 1
	if p.LateHandoff {
		clients += 2 // the late-handoff episode's holder and waiter (latehandoff.go)
	}
	lhClients := clients
	if p.GuardEpisode != nil {
		clients += 2 // the guard episode's two rounds (guard.go)
	}
	h := newHistory()
	h.Note("plan %v", p)
	cl := newCluster(p.Seed, clients, p.Nodes, p.Drift, p.Offset)
	env := &Env{Plan: p, History: h, cl: cl, start: h.start, faults: newFaultLog(p.Nodes, clients)}
	if p.LateHandoff {
		env.lh = &lateHandoff{a: lhClients - 2, b: lhClients - 1, first: make(chan struct{})}
	}
	if tag := ownBubble(); tag != "" {
		runs.Store(tag, env)
		defer runs.Delete(tag)
	}
	var nodeClients []redis.UniversalClient
	for c := range clients {
		ncs := cl.clients(c)
		nodeClients = append(nodeClients, ncs...)
		opts := p.Options(c)
		o := observer{Hooks: redlock.NoHooks{}, env: env, c: c}
		if p.Trace {
			o.Hooks = tracer{h: h, c: c}
		}
		opts = append(opts, redlock.WithHooks(o))
		rc, err := redlock.New(ncs, opts...)
		if err != nil {
			panic(fmt.Sprintf("sim: redlock.New: %v", err)) // the plan's options are valid
		}
		env.Clients = append(env.Clients, rc)
	}
	ctx, cancel := context.WithDeadline(context.Background(), env.At(p.Duration()))
	env.ctx = ctx
	for _, f := range p.Faults {
		env.Go(func() { env.fault(f) })
	}
	env.res = newResidue(env)
	for _, pr := range profiles {
		if _, ok := pr.(*LockProfile); ok {
			for ri := range p.Resources {
				env.res.sampled[redlock.DefaultKeyPrefix+resourceName(ri)] = true
			}
		}
	}
	env.Go(env.res.sample)
	if q := p.QuietLag; q != nil {
		env.Go(func() { env.quietLag(q) })
	}
	if p.SubClose {
		env.Go(func() { env.subClose(subClient) })
	}
	if p.LateHandoff {
		env.Go(env.lateHandoff)
	}
	if p.GuardEpisode != nil {
		env.Go(func() { env.guardEpisode(clients - 2) })
	}
	if p.SlowTime > 0 {
		cl.net.slowTime(p.SlowTime, p.SlowTimeUp)
		cl.net.timeVaries = p.SlowTimeVaries
	}
	if p.MsgDelay > 0 {
		cl.net.mu.Lock()
		cl.net.msgDelay = map[int]time.Duration{p.MsgClient: p.MsgDelay}
		cl.net.mu.Unlock()
	}
	for _, pr := range profiles {
		pr.Start(env)
	}
	// Bounded goroutines: sampled at the end of the quiet phase, before
	// the workers stop.
	var peak int
	env.Go(func() {
		if env.SleepUntil(env.At(p.Duration() - time.Millisecond)) {
			peak = countBubble()
		}
	})
	env.wg.Wait()
	cancel()
	h.Note("run over")
	if bound := goroutineBound(p, clients); peak > bound {
		h.Violate("goroutines", "%d goroutines in the bubble at the end of the quiet phase; the bound is %d", peak, bound)
	}
	h.checkHolds(!p.Wipes())
	for _, pr := range profiles {
		pr.Check(env)
	}
	// No goroutine outlives Close: after every Client's Close, nothing of
	// the library is left in this bubble.
	for c, rc := range env.Clients {
		start := time.Now()
		_ = rc.Close()
		if d := time.Since(start); d > p.NodeTimeout+time.Second {
			h.Violate("close", "client %d: Close took %v", c, d)
		}
		env.res.closedAt(c)
	}
	synctest.Wait()
	env.res.finish()
	if left := bubbleGoroutines("github.com/quorumlock/quorumlock/redlock", "github.com/quorumlock/quorumlock/renew", "github.com/quorumlock/quorumlock/quorum", "github.com/quorumlock/quorumlock/election"); left != "" {
		h.Violate("goroutine", "after Close: %s", left)
	}
	for _, n := range nodeClients {
		_ = n.Close()
	}
	cl.close()
	synctest.Wait()
	res := Result{Plan: p, Violations: h.Violations(), Holds: len(h.holds), Goroutines: peak}
	for _, pr := range profiles {
		if e, ok := pr.(interface{ Terms() int }); ok {
			res.Terms += e.Terms()
		}
	}
	if res.Failed() {
		res.Report = h.Report()
	}
	return res
}

var bubbleRE = regexp.MustCompile(`synctest bubble (\d+)`)

// runs maps the tag of each bubble running a seed (ownBubble) to its Env,
// for a hook of the library's that runs in the bubble but does not say
// which run it belongs to (NoteSendPause).
var runs sync.Map

// NoteSendPause records that an extension of this bubble's run is held d
// between its registration and its send (testhooks.ExtendPause, see
// sendDelay in main_test.go), before the pause. A pause longer than the
// node timeout less the longest round trip now is the Client's own fault,
// as a freeze of its process would be: its renewals miss their deadlines (a loss), and a Do whose
// renewal waits sends nothing carrying its token meanwhile (which the
// key-back check of tokens given up reads as a token left behind). The
// hook does not say which Client's extension it holds, so the pause
// counts for every Client of the run: as a fault for spurious-loss, and
// as an allowance for the key-back check of tokens given up while it
// lasts (not for released holds: a delayed extension registered before
// the release is guarded against, and its bound fixed before the pause).
func NoteSendPause(d time.Duration) {
	v, ok := runs.Load(ownBubble())
	if !ok {
		return
	}
	env := v.(*Env)
	// The request leaves after the pause and its node timeout counts from
	// before it: it answers in time only if the pause and the round trip
	// together stay within the node timeout (the quiet lag's round trip
	// is up to 0.9 of it; issue 42, seed 2926 at 0.43 NT each way).
	if d+2*env.cl.net.maxDelay() < env.Plan.NodeTimeout {
		return
	}
	now := time.Now()
	env.faults.addPause(now, now.Add(d))
	env.History.Note("an extension held %v between its registration and its send", d)
}

// goroutineBound is how many goroutines a run may have once faults
// stopped: per Client and node, its pooled connections (two forwarders,
// the reader of the down direction's queue and miniredis's two goroutines
// each, at most turnLimit connections in use: cluster.go) and the
// library's per-node workers and loops; and the run's own.
func goroutineBound(p Plan, clients int) int {
	w := max(p.Workers, p.SemK)                                         // a K=3 semaphore runs three workers per Client
	return clients*p.Nodes*(turnLimit*5+8) + clients*w*(4+p.SemK) + 128 // 64 more with issue 42's plans (seed 2104: 720 of 703)
}

// countBubble counts the goroutines of this bubble.
func countBubble() int {
	tag := ownBubble()
	if tag == "" {
		return 0
	}
	n := 0
	for _, g := range allStacks() {
		head, _, _ := strings.Cut(g, "\n")
		if strings.Contains(head, tag) {
			n++
		}
	}
	return n
}

// ownBubble is the tag that names this goroutine's bubble in a stack's
// head ("synctest bubble N]"), "" outside one.
func ownBubble() string {
	own := make([]byte, 1024)
	own = own[:runtime.Stack(own, false)]
	m := bubbleRE.FindSubmatch(own)
	if m == nil {
		return ""
	}
	return "synctest bubble " + string(m[1]) + "]"
}

func allStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// bubbleGoroutines returns the first stack of a goroutine in this bubble
// with a frame in one of pkgs, and how many there are; "" if none.
func bubbleGoroutines(pkgs ...string) string {
	tag := ownBubble()
	if tag == "" {
		return ""
	}
	count, first := 0, ""
	for _, g := range allStacks() {
		head, _, _ := strings.Cut(g, "\n")
		if !strings.Contains(head, tag) || strings.Contains(head, "running") {
			continue
		}
		for _, p := range pkgs {
			if strings.Contains(g, p+".") || strings.Contains(g, p+"/") {
				count++
				if first == "" {
					first = g
				}
				break
			}
		}
	}
	if count == 0 {
		return ""
	}
	return fmt.Sprintf("%d goroutines, the first:\n%s", count, first)
}

// faultLog is when each node and each Client was under a fault, for the
// checks that allow for one (a released key left on a node its release
// could not reach yet).
type faultLog struct {
	mu    sync.Mutex
	all   [][2]time.Time            // every fault, spikes too (spurious-loss)
	nodes [][][2]time.Time          // per node
	cl    [][][2]time.Time          // per client: frozen
	links map[linkID][][2]time.Time // delays and resets
	pause [][2]time.Time            // extensions held longer than the node timeout before their send (NoteSendPause)
	typed []typedFault              // every fault with what it hit (excuses)
}

// typedFault is one fault and what it hit: a node (client -1), or a
// Client's process or links (node -1 for all of them); client and node
// -1: every Client (the yield gate).
type typedFault struct {
	kind         FaultKind
	client, node int
	span         [2]time.Time
}

func newFaultLog(nodes, clients int) *faultLog {
	return &faultLog{nodes: make([][][2]time.Time, nodes), cl: make([][][2]time.Time, clients), links: make(map[linkID][][2]time.Time)}
}

func (f *faultLog) add(fl Fault, from, to time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := [2]time.Time{from, to}
	f.all = append(f.all, s)
	f.typed = append(f.typed, typedFault{fl.Kind, fl.Client, fl.Node, s})
	switch fl.Kind {
	case LinkSpike:
		// No allowance: what a spike holds lands soon after it, and the
		// release right after that (the chaos checker's rule).
	case LinkDelay, LinkReset, CommitDelay, CommitDrop:
		id := linkID{fl.Client, fl.Node}
		f.links[id] = append(f.links[id], s)
	case ClientFreeze:
		f.cl[fl.Client] = append(f.cl[fl.Client], s)
	default:
		f.nodes[fl.Node] = append(f.nodes[fl.Node], s)
	}
}

// addPause records an extension held from from to to before its send.
func (f *faultLog) addPause(from, to time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.all = append(f.all, [2]time.Time{from, to})
	f.pause = append(f.pause, [2]time.Time{from, to})
}

// paused reports whether an extension of the run was held before its
// send (addPause) at some time in [from, to].
func (f *faultLog) paused(from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.pause, func(s [2]time.Time) bool { return !s[0].After(to) && !s[1].Before(from) })
}

// allows reports whether a fault on node i, or on client c's connections
// to it, or of client c, other than a spike, was under way at t or ended
// less than after before it.
func (f *faultLog) allows(c, i int, t time.Time, after time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	in := func(ss [][2]time.Time) bool {
		for _, s := range ss {
			if !s[0].After(t) && !s[1].Add(after).Before(t) {
				return true
			}
		}
		return false
	}
	return in(f.nodes[i]) || (c >= 0 && c < len(f.cl) && in(f.cl[c])) || in(f.links[linkID{c, i}])
}

// delays reports whether something that can hold up a request from
// client c to node i was under way at some time in [from, to]: a fault of
// any kind (a spike too: a request sent into it lands after its caller's
// node timeout) on node i, on c's process, or on c's link to i, or an
// extension held before its send long enough to be recorded
// (NoteSendPause: of any Client of the run). A pause too short to be
// recorded leaves the request, and its round trip, within the node
// timeout. The yield gate (client and node -1) holds only yields.
func (f *faultLog) delays(c, i int, from, to time.Time) bool {
	return f.overlaps(from, to, func(t typedFault) bool {
		switch t.kind {
		case NodePause, NodeSlow, NodeKill, NodeWipe:
			return t.node == i
		case ClientFreeze:
			return t.client == c
		}
		return t.client == c && (t.node == i || t.node < 0)
	})
}

// excuses reports whether a fault that can cost client c a lock was under
// way at some time in [from, to]: one on a node (all its locks), or on c's
// process or links, or an extension held before its send (NoteSendPause:
// of any Client). Another Client's freeze, cut or slow links cannot: c's
// renewals and its keys do not pass through them (spurious-loss, issue
// 42: the frozen waiter of two seeds in three excused every loss of the
// quiet phase).
func (f *faultLog) excuses(c int, from, to time.Time) bool {
	return f.overlaps(from, to, func(t typedFault) bool {
		switch t.kind {
		case NodePause, NodeSlow, NodeKill, NodeWipe:
			return true
		}
		return t.client == c || t.client < 0
	})
}

// overlaps reports whether a fault that hits says counts, or an
// extension held before its send (NoteSendPause: of any Client), was
// under way at some time in [from, to].
func (f *faultLog) overlaps(from, to time.Time, hits func(typedFault) bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	in := func(s [2]time.Time) bool { return !s[0].After(to) && !s[1].Before(from) }
	return slices.ContainsFunc(f.typed, func(t typedFault) bool { return in(t.span) && hits(t) }) || slices.ContainsFunc(f.pause, in)
}

// any reports whether any fault (a spike too) was under way at some time
// in [from, to].
func (f *faultLog) any(from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.all, func(s [2]time.Time) bool { return !s[0].After(to) && !s[1].Before(from) })
}

// frozen reports whether client c was frozen at some time in [from, to].
func (f *faultLog) frozen(c int, from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.cl[c], func(s [2]time.Time) bool { return !s[0].After(to) && !s[1].Before(from) })
}

// lastEnd is when the last fault on a node or a link ended (the zero
// time if none did).
func (f *faultLog) lastEnd() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var end time.Time
	for _, ss := range f.nodes {
		for _, s := range ss {
			end = maxTime(end, s[1])
		}
	}
	for _, ss := range f.links {
		for _, s := range ss {
			end = maxTime(end, s[1])
		}
	}
	return end
}

// fault applies f at its time and undoes it after its duration.
func (e *Env) fault(f Fault) {
	if !e.SleepUntil(e.At(f.At)) {
		return
	}
	n := e.cl.net
	from := time.Now()
	e.faults.add(f, from, from.Add(f.For))
	e.History.Note("fault %v", f)
	switch f.Kind {
	case LinkDelay, LinkSpike:
		n.setDelay(f.Client, f.Node, f.Delay)
	case LinkReset:
		n.reset(f.Client, f.Node)
	case NodePause:
		n.pauseNode(f.Node, true)
	case NodeSlow:
		n.setSlow(f.Node, f.Delay)
	case NodeKill, NodeWipe:
		e.cl.kill(f.Node, f.Kind == NodeWipe)
	case ClientFreeze:
		n.freezeClient(f.Client, true)
	case CommitDelay:
		n.aimCommit(f.Client, f.Node, f.Delay)
	case CommitDrop:
		n.dropCommit(f.Client, f.Node, true)
	}
	// Undone at its end, or at the run's end, so that Close finds every
	// node and pipe working.
	if f.For > 0 {
		t := time.NewTimer(f.For)
		select {
		case <-t.C:
		case <-e.ctx.Done():
			t.Stop()
		}
	}
	switch f.Kind {
	case LinkDelay, LinkSpike:
		n.setDelay(f.Client, f.Node, 0)
	case NodePause:
		n.pauseNode(f.Node, false)
	case NodeSlow:
		n.setSlow(f.Node, 0)
	case NodeKill, NodeWipe:
		e.cl.restart(f.Node)
	case ClientFreeze:
		n.freezeClient(f.Client, false)
	case CommitDelay:
		n.aimCommit(f.Client, f.Node, 0)
	case CommitDrop:
		n.dropCommit(f.Client, f.Node, false)
	}
	if f.For > 0 {
		e.History.Note("fault %v undone", f)
	}
}
