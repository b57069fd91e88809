package sim

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// History is what a run saw, every time a reading of the bubble's fake
// clock (one clock for all: exact, and shared by nodes and clients).
type History struct {
	start time.Time

	mu     sync.Mutex // protects the fields below
	holds  []*Hold
	waits  []*Wait
	writes []Write
	events []string // faults and notes, in order, for the report
	viol   []Violation
	byTok  map[string]*Hold
	owners map[string]*owner // every token the workload was given (residue.go)
	limit  int               // most events kept for the report
	// excused: spans the liveness checks skip on every resource (a quiet
	// lag that cuts new connections, excuse).
	excused [][2]time.Time
}

// owner is what the workload knows of one token it was given: a lock, a
// read or write lock, a permit or an election term (residue.go).
type owner struct {
	client   int
	what     string
	released time.Time // when the workload gave it up (Unlock, Resign, a refused Resume, Close returned); zero while held
}

// Hold is one lock returned by Lock, TryLock or Do.
type Hold struct {
	ID       int
	Client   int
	Resource string
	Token    string
	Fence    int64
	Start    time.Time // the call returned
	End      time.Time // min(Unlock called, Lost closed, ValidUntil); zero while held
	Released time.Time // Unlock returned (zero: not yet, or never called)
	Op       string
	// Lost: the hold ended because the lock said it was lost (Lost()
	// closed, Valid() false, Extend's ErrLockLost), not by its holder.
	Lost bool
	// NotHeld: Unlock, called while Valid() was true, returned an error
	// matching ErrNotHeld (unlock-not-held).
	NotHeld bool
}

// Wait is one Lock call (also Do's), from its start to its return.
type Wait struct {
	Client   int
	Resource string
	Start    time.Time
	End      time.Time // zero while waiting
	Deadline time.Time // the call's ctx deadline (zero: none)
	// Frozen is when the frozen waiter's pipes were frozen: the liveness
	// bound does not count it as waiting then (zero: never).
	Frozen [2]time.Time
	Got    bool
}

// Write is one write offered to the fenced register.
type Write struct {
	Resource string
	Hold     int
	Fence    int64
	At       time.Time
	Applied  bool
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string // overlap, fence, stale-write, invalid-lock, key-back, liveness, goroutine, ...
	At        time.Duration
	Detail    string
}

// String is the violation in one line.
func (v Violation) String() string { return fmt.Sprintf("%s at %v: %s", v.Invariant, v.At, v.Detail) }

func newHistory() *History {
	return &History{start: time.Now(), byTok: make(map[string]*Hold), owners: make(map[string]*owner), limit: 20000}
}

// since is t as an offset from the run's start.
func (h *History) since(t time.Time) time.Duration { return t.Sub(h.start) }

// Note records a line of the run's history (faults, phases).
func (h *History) Note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.noteLocked(format, args...)
}

func (h *History) noteLocked(format string, args ...any) {
	if len(h.events) < h.limit {
		h.events = append(h.events, fmt.Sprintf("%9v ", h.since(time.Now()).Round(time.Microsecond))+fmt.Sprintf(format, args...))
	}
}

// Violate records a violation now.
func (h *History) Violate(inv, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.viol = append(h.viol, Violation{Invariant: inv, At: h.since(time.Now()), Detail: fmt.Sprintf(format, args...)})
}

// hold records a lock returned now.
func (h *History) hold(client int, resource, token string, fence int64, op string) *Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	x := &Hold{ID: len(h.holds), Client: client, Resource: resource, Token: token, Fence: fence, Start: time.Now(), Op: op}
	h.holds = append(h.holds, x)
	if token != "" {
		h.byTok[token] = x
		h.ownLocked(token, client, op)
	}
	h.noteLocked("c%d %s %s: hold %d fence %d token %.8s", client, op, resource, x.ID, fence, token)
	return x
}

func (h *History) endHold(x *Hold, end time.Time, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x.End.IsZero() {
		x.End = end
		x.Lost = why == "lost" || why == "not valid" || why == "extend: lost"
		h.noteLocked("c%d hold %d ends (%s)", x.Client, x.ID, why)
	}
}

func (h *History) released(x *Hold, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !x.Released.IsZero() {
		return // the first release counts (Close's, before its worker's Unlock)
	}
	x.Released = time.Now()
	if o := h.owners[x.Token]; o != nil && o.released.IsZero() {
		o.released = x.Released
	}
	if err != nil {
		h.noteLocked("c%d hold %d unlock: %v", x.Client, x.ID, firstLine(err))
	}
}

func (h *History) wait(client int, resource string, deadline time.Time) *Wait {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := &Wait{Client: client, Resource: resource, Start: time.Now(), Deadline: deadline}
	h.waits = append(h.waits, w)
	return w
}

func (h *History) endWait(w *Wait, got bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.End, w.Got = time.Now(), got
}

func (h *History) write(w Write) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.writes = append(h.writes, w)
}

// own records that client holds tok (what: the call that returned it).
func (h *History) own(tok string, client int, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ownLocked(tok, client, what)
}

func (h *History) ownLocked(tok string, client int, what string) {
	if o, ok := h.owners[tok]; ok {
		o.client, o.what = client, what // resumed by another Client
		return
	}
	h.owners[tok] = &owner{client: client, what: what}
}

// giveUp records that the workload gave tok up at t (the first time
// counts).
func (h *History) giveUp(tok string, t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o := h.owners[tok]; o != nil && o.released.IsZero() {
		o.released = t
	}
}

// ownerOf returns what the workload knows of tok.
func (h *History) ownerOf(tok string) (owner, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o, ok := h.owners[tok]
	if !ok {
		return owner{}, false
	}
	return *o, true
}

// byToken returns the hold of token, nil if none.
func (h *History) byToken(tok string) *Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byTok[tok]
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	return s
}

// checkHolds checks the invariants of holds and writes: no two holds of a
// resource overlap; with fence (no node restarted empty: DESIGN step 8
// needs the counters kept), fencing tokens strictly increase in the order
// holds started, and no write is applied with a token below that of a hold that
// started before it (the register saw it, or must have: every holder
// writes the moment it holds).
func (h *History) checkHolds(fence bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	end := time.Now()
	by := make(map[string][]*Hold)
	for _, x := range h.holds {
		by[x.Resource] = append(by[x.Resource], x)
	}
	for r, xs := range by {
		slices.SortStableFunc(xs, func(a, b *Hold) int { return a.Start.Compare(b.Start) })
		lastFence, lastID := int64(-1), -1
		for i, a := range xs {
			ae := a.End
			if ae.IsZero() {
				ae = end
			}
			for _, b := range xs[i+1:] {
				if !b.Start.Before(ae) {
					break
				}
				{
					h.viol = append(h.viol, Violation{"overlap", h.since(b.Start), fmt.Sprintf("%s: hold %d (c%d, %v..%v) and hold %d (c%d, from %v)",
						r, a.ID, a.Client, h.since(a.Start), h.since(ae), b.ID, b.Client, h.since(b.Start))})
				}
			}
			if a.Fence <= 0 || !fence {
				continue // Do: its fence is not known; a Client without fencing; or counters were wiped
			}
			if a.Fence <= lastFence {
				h.viol = append(h.viol, Violation{"fence", h.since(a.Start), fmt.Sprintf("%s: hold %d fence %d after hold %d fence %d",
					r, a.ID, a.Fence, lastID, lastFence)})
			}
			lastFence, lastID = a.Fence, a.ID
		}
	}
	// A hold's first write: the register knows its token only from then
	// (the frozen waiter's hold, say, never writes).
	wrote := make(map[int]time.Time)
	for _, w := range h.writes {
		if t, ok := wrote[w.Hold]; !ok || w.At.Before(t) {
			wrote[w.Hold] = w.At
		}
	}
	for _, w := range h.writes {
		if !w.Applied || !fence {
			continue
		}
		for _, x := range by[w.Resource] {
			if t, ok := wrote[x.ID]; ok && x.Fence > w.Fence && x.Start.Before(w.At) && !t.After(w.At) {
				h.viol = append(h.viol, Violation{"stale-write", h.since(w.At), fmt.Sprintf("%s: write of hold %d (fence %d) applied after hold %d (fence %d) began",
					w.Resource, w.Hold, w.Fence, x.ID, x.Fence)})
				break
			}
		}
	}
}

// checkLiveness checks the bound once faults stopped: from from to to, a
// resource with a waiter (a Lock call, its ctx live, not frozen) is never
// without a holder for longer than bound. skip are spans per resource
// that the bound does not cover (a frozen waiter that turned holder).
func (h *History) checkLiveness(from, to time.Time, bound time.Duration, skip map[string][][2]time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.livenessLocked("liveness", h.waits, h.holds, from, to, bound, skip)
}

// livenessLocked is checkLiveness over the given waits and holds, its
// violation named inv (a profile that keeps its own, such as the
// election's, checks them with it). h.mu must be held.
func (h *History) livenessLocked(inv string, waits []*Wait, holds []*Hold, from, to time.Time, bound time.Duration, skip map[string][][2]time.Time) {
	const step = time.Millisecond
	res := make(map[string]bool)
	for _, w := range waits {
		res[w.Resource] = true
	}
	for r := range res {
		var gapStart time.Time
		var gapWho *Wait
		for t := from; t.Before(to); t = t.Add(step) {
			waiting, held := false, false
			var who *Wait
			for _, w := range waits {
				frozen := !w.Frozen[0].IsZero() && !t.Before(w.Frozen[0]) && (w.Frozen[1].IsZero() || t.Before(w.Frozen[1]))
				if w.Resource == r && !frozen && !w.Start.After(t) && (w.End.IsZero() || w.End.After(t)) && (w.Deadline.IsZero() || w.Deadline.After(t)) {
					waiting, who = true, w
					break
				}
			}
			for _, x := range holds {
				if x.Resource == r && !x.Start.After(t) && (x.End.IsZero() || x.End.After(t)) {
					held = true
					break
				}
			}
			for _, s := range skip[r] {
				if !t.Before(s[0]) && t.Before(s[1]) {
					held = true
				}
			}
			if h.excusedAt(t) {
				held = true
			}
			switch {
			case waiting && !held && gapStart.IsZero():
				gapStart, gapWho = t, who
			case (!waiting || held) && !gapStart.IsZero():
				gapStart = time.Time{}
			}
			if !gapStart.IsZero() && t.Sub(gapStart) > bound {
				h.viol = append(h.viol, Violation{inv, h.since(gapStart), fmt.Sprintf("%s: waiters and no holder for more than %v from %v (c%d waiting since %v)",
					r, bound, h.since(gapStart), gapWho.Client, h.since(gapWho.Start))})
				break
			}
		}
	}
}

// Violations returns the violations recorded.
func (h *History) Violations() []Violation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.viol)
}

// Report is the compact history: the events, then the violations.
func (h *History) Report() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, e := range h.events {
		b.WriteString(e)
		b.WriteByte('\n')
	}
	if len(h.events) >= h.limit {
		fmt.Fprintf(&b, "… (first %d events only)\n", h.limit)
	}
	for _, v := range h.viol {
		b.WriteString("VIOLATION ")
		b.WriteString(v.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// excuse excuses the liveness checks from from to to, on every resource:
// a quiet lag that cuts new connections (aimed42.go quietLag).
func (h *History) excuse(from, to time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.excused = append(h.excused, [2]time.Time{from, to})
}

// excusedAt reports whether t is in a span excused (excuse). h.mu must be
// held.
func (h *History) excusedAt(t time.Time) bool {
	for _, s := range h.excused {
		if !t.Before(s[0]) && t.Before(s[1]) {
			return true
		}
	}
	return false
}
