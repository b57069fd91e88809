package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/redlock"
)

// The residue check (issue 42): every key of every kind that the library
// writes on a node — lock and permit keys, release guards, queue entries,
// read-write waiter entries, reader marks, election identities, and the
// Clients' own identity keys — is read every TTL/20 on every node,
// directly, and once more after every Client's Close. Each token found in
// one (a lock key's value, a guard's name, a member of a queue, of the
// readers or of the read-write waiters, an election identity's term) is
// counted only while it is live on the node (a queue entry until its lapse
// deadline, a reader mark until its score, both on the node's clock: they
// are pruned lazily), and must satisfy:
//
//   - ownership: the token is one a Client sent (the fault layer saw a
//     request carrying it), and its remaining life is within its kind's
//     bound (expiryBound): a lock or permit key the TTL, a queue entry a
//     queue entry's life, a reader mark the TTL, a guard the TTL, an
//     election identity the TTL;
//   - nothing left behind: a token the workload gave up (Unlock, a refused
//     Resume, a Resign, Close returned) is gone from a node leftBound
//     (half a TTL) after that; a token of no hold the workload knows (an
//     attempt abandoned, a grant yielded or expired before Lock could
//     return it, a semaphore's extra permits, a call that failed) is gone
//     leftBound after the last request carrying it reached that node. A
//     fault on the node, on the token's Client or on its link to the node
//     allows it from the fault's start to a TTL and a second after its end,
//     as key-back does.
//
// After every Close (the mid-run Close of the close episode, and the
// run's end), no identity key of the closed Client is left on a node
// (close-left), nor any key or entry of its tokens whose remaining life is
// longer than a reservation (a key a release handed to an entry of a call
// already over; anything else Close had to release or wait out).
//
// The lock profile's own sampler (key-back) keeps the lock keys of its
// resources r0.. (sampled: the keys it covers); this check covers every
// other key.

// residue is the state of the residue check of one run.
type residue struct {
	env     *Env
	mu      sync.Mutex      // protects the fields below
	sampled map[string]bool // lock keys the lock profile's sampler checks (key-back)
	seen    map[string]bool // violations reported, per token, node and kind
	unknown map[string]string
	closed  map[int]time.Time // per Client: when its Close returned
}

func newResidue(env *Env) *residue {
	return &residue{env: env, sampled: make(map[string]bool), seen: make(map[string]bool), unknown: make(map[string]string), closed: make(map[int]time.Time)}
}

// occurrence is one live token on a node: in key, of kind, with life left
// (on the bubble's clock).
type occurrence struct {
	key, kind, token string
	left             time.Duration
}

// leftBound is how long after a token was given up (or last carried to
// the node, for a token of no hold) a live occurrence of it may remain:
// half a TTL, above a queue entry's life and a reservation (1.22 s at the
// plan's options), a guard's life (a node timeout and the clock
// estimate's error), and a renew interval's gap for a token still renewed
// by a hold the workload does not see (an election's lock).
func leftBound(p Plan) time.Duration { return p.TTL / 2 }

// expiryBound is the most life a live occurrence of kind may have left,
// on the bubble's clock (a node's clock runs up to DriftFactor slow).
func expiryBound(p Plan, kind string) time.Duration {
	life := p.TTL
	if kind == "queue entry" || kind == "rw entry" {
		life = 2*p.RetryMax + 4*p.NodeTimeout // redlock's queue entry life
	}
	return time.Duration(float64(life)*(1+DriftFactor)) + 2*time.Millisecond
}

// scan reads every key of node i and returns the live occurrences of
// tokens, and the Clients' identity keys found.
func (r *residue) scan(i int) (occ []occurrence, ids []string) {
	cl := r.env.cl
	m := cl.node(i)
	if m == nil {
		return nil, nil
	}
	cl.tick(i, m)
	nowMS := cl.nodeTime(i).UnixMilli()
	life := func(ms float64) time.Duration {
		return cl.clientDur(i, time.Duration(ms-float64(nowMS))*time.Millisecond)
	}
	pre := redlock.DefaultKeyPrefix
	for _, k := range m.Keys() {
		switch {
		case strings.HasPrefix(k, pre+"node:"):
			ids = append(ids, k)
		case strings.Contains(k, scripts.GuardSuffix):
			_, tok, _ := strings.Cut(k, scripts.GuardSuffix)
			occ = append(occ, occurrence{k, "guard", tok, cl.clientDur(i, m.TTL(k))})
		case strings.HasSuffix(k, scripts.QueueSuffix):
			zs, err := sortedSet(m, k)
			if err != nil {
				continue
			}
			for e := range zs {
				f := strings.Split(e, "#")
				if len(f) != 5 {
					continue
				}
				dl, err := strconv.ParseInt(f[3], 10, 64)
				if err != nil || dl <= nowMS {
					continue // lapsed, not pruned yet
				}
				occ = append(occ, occurrence{k, "queue entry", f[2], life(float64(dl))})
			}
		case strings.HasSuffix(k, scripts.ReadersSuffix):
			zs, err := sortedSet(m, k)
			if err != nil {
				continue
			}
			for tok, exp := range zs {
				if exp > float64(nowMS) {
					occ = append(occ, occurrence{k, "reader mark", tok, life(exp)})
				}
			}
		case strings.HasSuffix(k, scripts.RWWaitSuffix):
			lapse, _ := sortedSet(m, k+":lapse")
			zs, err := sortedSet(m, k)
			if err != nil {
				continue
			}
			for e := range zs {
				f := strings.Split(e, "/")
				dl, ok := lapse[e]
				if len(f) != 3 || !ok || dl <= float64(nowMS) {
					continue
				}
				occ = append(occ, occurrence{k, "rw entry", f[2], life(dl)})
			}
		case strings.HasSuffix(k, election.LeaderSuffix):
			v, err := m.Get(k)
			if err != nil {
				continue
			}
			var l election.Leader
			if json.Unmarshal([]byte(v), &l) == nil && l.Term != "" {
				occ = append(occ, occurrence{k, "election identity", l.Term, cl.clientDur(i, m.TTL(k))})
			}
		case m.Type(k) == "string":
			v, err := m.Get(k)
			if err != nil {
				continue
			}
			kind := "lock key"
			if strings.Contains(k, ":permit:") {
				kind = "permit key"
			}
			for _, t := range findTokens([]byte(v)) {
				occ = append(occ, occurrence{k, kind, string(t), cl.clientDur(i, m.TTL(k))})
			}
		}
	}
	return occ, ids
}

// check applies the rules to node i now; final: the scan after every
// Client's Close.
func (r *residue) check(i int, final bool) {
	env := r.env
	pl, h := env.Plan, env.History
	now := time.Now()
	occ, ids := r.scan(i)
	r.mu.Lock()
	defer r.mu.Unlock()
	report := func(inv string, o occurrence, format string, args ...any) {
		k := inv + o.token + o.kind + strconv.Itoa(i)
		if r.seen[k] {
			return
		}
		r.seen[k] = true
		h.Violate(inv, "%s on node %d: %s of token %.8s: %s", o.key, i, o.kind, o.token, fmt.Sprintf(format, args...))
	}
	for _, o := range occ {
		if o.kind == "lock key" && r.sampled[o.key] {
			continue
		}
		if b := expiryBound(pl, o.kind); o.left > b {
			report("expiry-bound", o, "%v of life left, more than its bound %v", o.left.Round(time.Millisecond), b)
		}
		own, known := h.ownerOf(o.token)
		td, c, delivered := env.cl.net.lastDelivered(o.token, i)
		if known {
			c = own.client
		}
		if !delivered && !known {
			if _, anywhere := env.cl.net.client(o.token); !anywhere {
				// Checked after the run: a request carrying it may be
				// on its way to being noted.
				r.unknown[o.token] = fmt.Sprintf("%s on node %d: %s of token %.8s, which no request of a Client carried", o.key, i, o.kind, o.token)
			}
			continue
		}
		if final {
			if at, ok := r.closed[c]; ok && o.left > pl.Reservation()+2*time.Millisecond && !(o.kind == "guard") && !(known && own.released.IsZero()) {
				report("close-left", o, "%v left after c%d's Close returned at %v", o.left.Round(time.Millisecond), c, h.since(at))
			}
		}
		var from time.Time
		switch {
		case o.kind == "guard" && delivered:
			// A guard is written by a release, which may land late
			// (a node's retry loop): it counts from the last request
			// carrying the token there.
			from = td
		case known && !own.released.IsZero():
			from = own.released
		case known:
			continue // held: its owner renews it
		default:
			from = td
		}
		if now.Sub(from) < leftBound(pl) || env.faults.allows(c, i, now, pl.TTL+time.Second) || env.faults.paused(from, now) {
			continue
		}
		what := "last carried to the node at"
		if known {
			what = "given up (" + own.what + ") at"
		}
		report("left-behind", o, "c%d's, %s %v, still there at %v with %v left", c, what, h.since(from), h.since(now), o.left.Round(time.Millisecond))
	}
	for _, k := range ids {
		for c, at := range r.closed {
			if id := env.cl.net.clientID(c); id != "" && strings.Contains(k, ":"+id+":") && now.Sub(at) >= pl.NodeTimeout && !env.faults.allows(c, i, now, pl.TTL+time.Second) {
				o := occurrence{key: k, kind: "identity key", token: id}
				report("close-left", o, "c%d's identity key, its Close returned at %v", c, h.since(at))
			}
		}
	}
}

// closedAt records that client c's Close returned now.
func (r *residue) closedAt(c int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.closed[c]; !ok {
		r.closed[c] = time.Now()
	}
}

// sample runs the check on every node every TTL/20 until the run's end.
func (r *residue) sample() {
	env := r.env
	for env.SleepUntil(time.Now().Add(env.Plan.TTL / 20)) {
		for i := range env.Plan.Nodes {
			r.check(i, false)
		}
	}
}

// finish is the scan after every Client's Close, and the ownership
// check of the tokens no request was seen carrying.
func (r *residue) finish() {
	// A node timeout after the last Close: Close waits for its deletes
	// of the identity keys at most about that long.
	time.Sleep(r.env.Plan.NodeTimeout)
	for i := range r.env.Plan.Nodes {
		r.check(i, true)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for tok, what := range r.unknown {
		if _, ok := r.env.cl.net.client(tok); !ok {
			r.env.History.Violate("ownership", "%s", what)
		}
	}
}

// sortedSet returns a copy of the sorted set k of node m. miniredis's
// SortedSet hands out its own map and releases its lock before returning,
// so ranging over that map races with the node's commands (a script's
// ZPOPMAX deletes from it); the copy is taken under the node's lock, the
// one miniredis's commands hold while they write.
func sortedSet(m *miniredis.Miniredis, k string) (map[string]float64, error) {
	zs, err := m.SortedSet(k)
	if err != nil {
		return nil, err
	}
	m.Lock()
	defer m.Unlock()
	return maps.Clone(zs), nil
}
