package sim

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// The expired-grant episode (Plan.GrantExpired, issue 42): a grant whose
// validity ran out before Lock or TryLock could return it. In fake time
// nothing runs between a grant and Lock's last check (redlock's handOut),
// so the episode plays a process starved there: testhooks.AfterHold (set
// for the whole package in TestMain) sleeps, in the bubble of the run whose
// episode armed it (runs, ownBubble), past the lock's validity. The call
// carries WithDriftFactor(gxDrift), so its validity (0.6 TTL) ends well
// before its keys expire on the nodes (a TTL after they were set): the
// library must release them (redlock's drop), not leave them to their
// TTL. The check (expired-grant):
//
//   - TryLock returns no lock and an error matching ErrGrantExpired;
//     Lock, which goes on with a new token, returns a lock of another
//     token (or its ctx's error);
//   - gxBound (two node timeouts and the longest round trip) after the
//     grant was dropped, no key, queue entry or other occurrence of the
//     dropped token but its release's guard is left on a node that had no
//     fault, and whose link from the Client had none, since the call.
//
// A release that never lands (the control expired-release-dropped), or a
// library that forgets to release an expired grant (the mutant
// drop-keeps-keys), leaves the keys for 0.3 TTL or more past the bound.

// gxResource is the episode's resource: no worker uses it, and its name
// is found in a release's bytes (the control).
const gxResource = "gx-expired"

// gxDrift is the drift factor of the episode's call: its validity is
// TTL·(1 − gxDrift) − 2 ms, 1.8 s at the plan's TTL.
const gxDrift = 0.4

// gxSleep is how long the starved caller sleeps after the grant: past the
// validity (0.6 TTL from before the first request) and well before the
// keys' expiry (a TTL from their arrival).
func gxSleep(p Plan) time.Duration { return p.TTL * 65 / 100 }

// gxBound is how long after the drop the dropped token's keys may stay on
// a healthy node: a clock probe (a node timeout at most), then the
// release (a node timeout at most), and the longest round trip now.
func gxBound(p Plan, n *network) time.Duration { return 2*p.NodeTimeout + 2*n.maxDelay() }

// gxEpisode is the state of one run's episode.
type gxEpisode struct {
	client  int
	armed   atomic.Bool // the next hold of gxResource in this run starves
	fired   atomic.Bool
	token   string    // the dropped grant's token (read on the nodes)
	called  time.Time // when the call began
	dropped time.Time // when the hook returned (the drop follows at once)
	checked chan struct{}
}

// expiredReleaseDropped is the negative control of expired-grant
// (controls_test.go): every release of gxResource is swallowed on its way.
var expiredReleaseDropped atomic.Bool

// gxKey is the episode's lock key, as a release carries it.
var gxKey = []byte(redlock.DefaultKeyPrefix + gxResource)

// dropsExpiredRelease reports whether the control swallows chunk b.
func dropsExpiredRelease(b []byte) bool {
	return expiredReleaseDropped.Load() && bytes.Contains(b, releaseSHA) && bytes.Contains(b, gxKey)
}

// afterHold is testhooks.AfterHold for the package: a hold of gxResource
// in a run whose episode is armed starves past its validity.
var afterHold = func(resource string) {
	if resource != gxResource {
		return
	}
	v, ok := runs.Load(ownBubble())
	if !ok {
		return
	}
	v.(*Env).starve()
}

// starve is the starved caller: it notes the grant's token, sleeps past
// its validity and starts the check.
func (e *Env) starve() {
	g := e.gx.Load()
	if g == nil || !g.armed.CompareAndSwap(true, false) {
		return
	}
	cl := e.cl
	for i := range e.Plan.Nodes {
		m := cl.node(i)
		if m == nil {
			continue
		}
		cl.tick(i, m)
		if v, err := m.Get(string(gxKey)); err == nil {
			if ts := findTokens([]byte(v)); len(ts) > 0 {
				g.token = string(ts[0])
				break
			}
		}
	}
	g.fired.Store(true)
	if g.token != "" {
		// Held (by a caller that cannot know it yet) until the drop:
		// left-behind counts from then.
		e.History.own(g.token, g.client, "grant starved before the call's return")
	}
	e.History.Note("c%d's grant of %s (token %.8s) starves %v before Lock's last check (expired-grant episode)", g.client, gxResource, g.token, gxSleep(e.Plan))
	time.Sleep(gxSleep(e.Plan))
	g.dropped = time.Now()
	e.History.giveUp(g.token, g.dropped)
	bound := gxBound(e.Plan, cl.net)
	e.Go(func() {
		defer close(g.checked)
		time.Sleep(bound)
		e.checkExpired(g, bound)
	})
}

// checkExpired looks for the dropped token on every node healthy since
// the call.
func (e *Env) checkExpired(g *gxEpisode, bound time.Duration) {
	if g.token == "" {
		return
	}
	now := time.Now()
	for i := range e.Plan.Nodes {
		if e.faults.allows(g.client, i, now, now.Sub(g.called)) {
			continue
		}
		occ, _ := e.res.scan(i)
		for _, o := range occ {
			if o.token == g.token && o.kind != "guard" {
				e.History.Violate("expired-grant", "%s on node %d: %s of token %.8s, a grant that expired before c%d's call could return it, still there %v after it was dropped (bound %v; %v of life left)", o.key, i, o.kind, o.token, g.client, now.Sub(g.dropped), bound, o.left)
				break
			}
		}
	}
}

// expiredGrant is the episode: client c calls Lock or TryLock on
// gxResource, its grant starves past its validity (starve), and the call's
// result is checked; the keys are checked by the hook's goroutine.
func (p *LockProfile) expiredGrant(env *Env) {
	pl := env.Plan
	if !env.SleepUntil(env.At(pl.Healed() - pl.TTL + pl.GXAt)) {
		return
	}
	g := &gxEpisode{client: pl.GXClient, checked: make(chan struct{}), called: time.Now()}
	g.armed.Store(true)
	env.gx.Store(g)
	h := env.History
	rc := env.Clients[g.client]
	ctx, cancel := context.WithTimeout(env.Ctx(), pl.TTL)
	defer cancel()
	opt := redlock.WithDriftFactor(gxDrift)
	var l *redlock.Lock
	var err error
	if pl.GXLock {
		l, err = rc.Lock(ctx, gxResource, opt)
	} else {
		l, err = rc.TryLock(ctx, gxResource, opt)
	}
	if l != nil {
		h.own(l.Token(), g.client, "the expired-grant episode's Lock")
		defer func() {
			_ = l.Unlock(context.WithoutCancel(ctx))
			h.giveUp(l.Token(), time.Now())
		}()
	}
	if !g.fired.Load() {
		h.Note("expired-grant episode: c%d's call did not reach a grant (%v)", g.client, err)
		return
	}
	<-g.checked
	switch {
	case errors.Is(err, redlock.ErrClosed) || ctx.Err() != nil:
	case !pl.GXLock && (l != nil || !errors.Is(err, redlock.ErrGrantExpired)):
		h.Violate("expired-grant", "c%d's TryLock, whose grant expired before it could return it, returned %v, %v; want ErrGrantExpired", g.client, l != nil, err)
	case pl.GXLock && err == nil && l.Token() == g.token:
		h.Violate("expired-grant", "c%d's Lock returned the grant that expired before it could (token %.8s)", g.client, g.token)
	}
}
