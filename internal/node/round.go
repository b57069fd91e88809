package node

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// Owner is what a Token needs of the lock that keeps it (package redlock's
// Lock), beyond its mutex (Set.Token): whether the token may still send,
// and how a failed request is reported.
type Owner interface {
	// Open reports, with the owner's mutex held, whether a round that
	// needs the token held (Op.Held) may still be sent.
	Open() bool
	// Usable is the owner's error when Open said no (mutex not held).
	Usable() error
	// Fail is the error of a request of op to node i that failed with err
	// (package redlock: a *NodeError, reported to the hooks).
	Fail(ctx context.Context, i int, op string, err error) error
}

// Op says what a round of a token is for; Run says how it may land.
type Op struct {
	// Name is what the requests are for, as a failed one reports it.
	Name string
	// Held: the round is registered only while the owner holds the token
	// (Owner.Open), in one step with that check (an extension).
	Held bool
	// Owner, when set, is the owner whose Open and Usable a Held round
	// asks instead of the Token's: the handle the call was made on, when
	// the token's lease can pass between handles.
	Owner Owner
	// Follow: each request goes after the Client's own releases of the
	// token's keys in flight there when the round was registered, so that
	// its own leftovers never refuse it (an acquire; see Set.beginRelease).
	Follow bool
	// Bound: each request carries its node's not-after bound for the
	// token's key (Set.notAfter), which fn passes to its script.
	Bound bool
	// Release: not a lock request, so it goes out even once two nodes were
	// found to reach one server (a lock granted before must be released).
	Release bool
	// Only, when set, runs first for node i, outside the node's gates: a
	// request is sent there only if it says so; else node i's reply is
	// the zero value and its error.
	Only func(ctx context.Context, i int) (send bool, err error)
}

// Run sends one round of the token t to every node, as op says: it
// registers the round before anything of it is sent, with its start (so
// its deadline, t's node timeout after it, and every request's not-after
// bound) fixed there (see Token); each node's request then passes the
// Set's gates (Call), waits for the releases it follows, and gets its
// bound, which fn passes to its script (nil without op.Bound). A failed
// request's error is the owner's (Owner.Fail). It returns the owner's
// error, and sends nothing, when op.Held and the token is no longer held.
func Run[T any](ctx context.Context, t *Token, op Op, fn func(ctx context.Context, i int, s redis.Scripter, notAfter *int64) (T, error)) (*quorum.Round[T], error) {
	if op.Held && testhooks.ExtendRegisterLate.Load() {
		return runLate(ctx, t, op, fn)
	}
	p, err := t.register(op.Held, op.Owner)
	if err != nil {
		return nil, err
	}
	if op.Follow {
		p.before = t.set.releasesBefore(t.keys)
	}
	if op.Held {
		testhooks.BeforeExtendSend()
	}
	return send(ctx, t, p, op, fn), nil
}

func send[T any](ctx context.Context, t *Token, p *pendingRound, op Op, fn func(ctx context.Context, i int, s redis.Scripter, notAfter *int64) (T, error)) *quorum.Round[T] {
	switch { // a not-after bound per node, in p itself when there are few
	case op.Bound && t.n <= len(p.small):
		p.bounds = p.small[:t.n]
	case op.Bound:
		p.bounds = make([]int64, t.n)
	}
	return quorum.StartAt(ctx, p.Start, t.n, t.timeout, t.sp, func(ctx context.Context, i int) (T, error) {
		var zero T
		if op.Only != nil {
			if ok, err := op.Only(ctx, i); !ok || err != nil {
				p.ended(i, err)
				return zero, err
			}
		}
		// Our own releases there land first (Follow), each within its node
		// timeout.
		if fs := p.before; fs != nil {
		follow:
			for _, f := range fs[i] {
				select {
				case <-f:
				case <-ctx.Done():
					break follow
				}
			}
		}
		v, err := call(ctx, t, i, !op.Release, func(ctx context.Context, s redis.Scripter) (T, error) {
			if !op.Bound {
				return fn(ctx, i, s, nil)
			}
			b, err := t.set.notAfter(ctx, i, t.keys[i].Lock)
			if err != nil {
				return zero, err
			}
			p.bounds[i] = b // kept in p, so that the script's arguments box it once
			return fn(ctx, i, s, &p.bounds[i])
		})
		p.ended(i, err)
		if err != nil {
			return zero, t.own.Fail(ctx, i, op.Name, err)
		}
		return v, nil
	})
}

// runLate is Run under the negative control testhooks.ExtendRegisterLate:
// the round is sent first, and its nodes that did not answer are marked
// only once it has settled, so a release in between does not see it.
func runLate[T any](ctx context.Context, t *Token, op Op, fn func(ctx context.Context, i int, s redis.Scripter, notAfter *int64) (T, error)) (*quorum.Round[T], error) {
	own := op.Owner
	if own == nil {
		own = t.own
	}
	if err := own.Usable(); err != nil {
		return nil, err
	}
	testhooks.BeforeExtendSend()
	r := send(ctx, t, &pendingRound{Start: time.Now()}, op, fn)
	t.sp.Go(func() {
		r.Wait()
		t.mu.Lock()
		defer t.mu.Unlock()
		for i := range t.n {
			if rep, _ := r.Reply(i); !Answered(rep.Err) {
				t.markUnsureLocked(i)
			}
		}
	})
	return r, nil
}

// Batch sends one round for the tokens ts, all held (Op.Held) and of one
// Set, with one request per node for all of them: a pipeline of script s
// (pipeline), where queue builds the command of ts[j], a token still held
// (in live), on node i, given its not-after bound (on a plain node one
// for all, on a Cluster node one per live token, on its key's master's
// clock); each node's reply is the commands, in the order of live. Each token registers the round as Run would; the
// round starts at the first registration, so no token's deadline is later
// than its registration fixed, and its timeout is the shortest of theirs.
// errs[k] is token k's owner's error when it was not held (nil r when none
// was); owners, when set, are the owners asked instead of the tokens' (see
// Op.Owner); fail is the error of a failed request to node i.
func Batch(ctx context.Context, ts []*Token, owners []Owner, op Op, fail func(ctx context.Context, i int, err error) error, s scripts.Script, queue func(ctx context.Context, p redis.Pipeliner, i, j int, notAfter *int64) *redis.Cmd) (r *quorum.Round[[]*redis.Cmd], live []int, errs []error) {
	errs = make([]error, len(ts))
	var pend []*pendingRound
	var timeout time.Duration
	for k, t := range ts {
		var own Owner
		if owners != nil {
			own = owners[k]
		}
		p, err := t.register(true, own)
		if err != nil {
			errs[k] = err
			continue
		}
		live = append(live, k)
		pend = append(pend, p)
		if timeout == 0 || t.timeout < timeout {
			timeout = t.timeout
		}
	}
	if len(live) == 0 {
		return nil, nil, errs
	}
	set := ts[live[0]].set
	r = quorum.StartAt(ctx, pend[0].Start, len(set.Nodes), timeout, ts[live[0]].sp, func(ctx context.Context, i int) ([]*redis.Cmd, error) {
		v, err := Call(ctx, set, i, !op.Release, timeout, func(ctx context.Context, _ redis.Scripter) ([]*redis.Cmd, error) {
			bounds := make([]int64, 1)
			if set.Nodes[i].Cluster {
				bounds = make([]int64, len(live))
			}
			for k := range bounds {
				var err error
				if bounds[k], err = set.notAfter(ctx, i, ts[live[k]].keys[i].Lock); err != nil {
					return nil, err
				}
			}
			return pipeline(ctx, set.Nodes[i].C, len(live), s, func(p redis.Pipeliner, kk int) *redis.Cmd {
				return queue(ctx, p, i, live[kk], &bounds[min(kk, len(bounds)-1)])
			})
		})
		for _, p := range pend {
			p.ended(i, err)
		}
		if err != nil {
			return v, fail(ctx, i, err)
		}
		return v, nil
	})
	return r, live, errs
}

// register registers a round of the token that starts now, before
// anything of it is sent. With held, it does so under the owner's lock and
// only if the owner says the token may still send then (Owner.Open): the
// owner ends the token (a release, a handover) under that lock, so a
// release that comes later sees the round pending — every node
// unanswered, so it leaves the guard — and a round that would come after
// it is never registered; it then returns the owner's error (Usable).
// Without held (an acquire attempt, its fence commit and yields, Resume's
// rounds, Detach's leaving the queues: the lock is not handed out, and its
// release comes from the same goroutine after the round) it always
// registers.
func (g *Token) register(held bool, own Owner) (*pendingRound, error) {
	if own == nil {
		own = g.own
	}
	for {
		g.ownMu.Lock()
		if !held || own.Open() {
			p := &pendingRound{Start: time.Now(), t: g}
			g.mu.Lock()
			g.openLocked(p.Start)
			g.mu.Unlock()
			g.ownMu.Unlock()
			return p, nil
		}
		g.ownMu.Unlock()
		if err := own.Usable(); err != nil {
			return nil, err
		}
	}
}

// openLocked counts a round that starts at start as open on every node
// until each node's request ends (ended). g.mu is held.
func (g *Token) openLocked(start time.Time) {
	if g.open == nil {
		g.open = make([]int, g.n)
	}
	for i := range g.open {
		g.open[i]++
	}
	g.last = start
}

// ended records that node i's request of the registered round p ended
// with err: if it may still land (not Answered), node i stays unanswered
// for good.
func (p *pendingRound) ended(i int, err error) {
	g := p.t
	if g == nil {
		return
	}
	answered := err == nil || Answered(err) // nil: the node replied
	g.mu.Lock()
	defer g.mu.Unlock()
	if !answered {
		g.markUnsureLocked(i)
	}
	g.open[i]--
	if g.idle != nil && !g.anyOpenLocked() {
		close(g.idle)
		g.idle = nil
	}
}

// anyOpenLocked reports whether a request of a registered round has not
// ended on some node. g.mu is held.
func (g *Token) anyOpenLocked() bool {
	for _, o := range g.open {
		if o > 0 {
			return true
		}
	}
	return false
}

func (g *Token) markUnsureLocked(i int) {
	if g.unsure == nil {
		g.unsure = make([]bool, g.n)
	}
	g.unsure[i] = true
}

// The order of a Client's own requests to one key on one node: an acquire
// goes after this Client's releases of the key in flight there when its
// round was registered (Op.Follow), so that its own leftovers never
// refuse it. A release registers itself (Set.beginRelease, release.go).

// relKey names a lock key on one node; Set.releasing holds, per
// relKey, one channel per release of it in flight there, closed when that
// release ends.
type relKey struct {
	key  string // the lock key on the node
	node int
}

// releasesBefore returns, per node, this Client's releases of keys in
// flight now (nil: none anywhere). An acquire round takes it when it is
// registered, and each of its requests waits for those only
// (send): a release registered later is never one it must
// follow, and may be its own call's cleanup, which waits for the
// request's answer — a request that started late waited for it, the two
// until the node timeout, and every acquire of the key on that node
// behind them (lockbench's semaphore: waits in steps of one node timeout;
// TestLate_lateRequestDoesNotWaitForItsOwnCleanup).
func (s *Set) releasesBefore(keys []scripts.Keys) [][]chan struct{} {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if len(s.releasing) == 0 {
		return nil
	}
	var out [][]chan struct{}
	for i, k := range keys {
		for _, key := range k.LockKeys() {
			if fs := s.releasing[relKey{key, i}]; len(fs) > 0 {
				if out == nil {
					out = make([][]chan struct{}, len(keys))
				}
				out[i] = append(out[i], fs...)
			}
		}
	}
	return out
}
