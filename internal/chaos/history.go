package chaos

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// Hold is one acquisition as the client saw it. Every time in it is a
// time.Now() reading of this process, so they all share one monotonic clock.
type Hold struct {
	ID       int
	Client   int
	Resource string
	Fence    int64
	// Shared is set for a read lock (rwlock profiles): two shared holds
	// may overlap; a shared hold and any other may not.
	Shared bool
	// Start is when Lock returned the lock.
	Start time.Time
	// ValidAtReturn is Valid() read at Start, ValidLeft ValidUntil − Start
	// then: Lock and TryLock must never return a lock that is not valid.
	ValidAtReturn bool
	ValidLeft     time.Duration
	// Unlock is when the worker called Unlock; zero if it never did.
	// Released is when Unlock returned.
	Unlock, Released time.Time
	// LostAt is when Lost() was seen closed, OnLostAt when OnLost ran;
	// zero if the loss was never reported.
	LostAt, OnLostAt time.Time
	// ValidUntil is the lock's last ValidUntil, read once it had ended.
	ValidUntil time.Time
}

// End is when the hold ended: the earliest of Unlock, the loss reports and
// ValidUntil. After it, the holder had no right to act.
func (h Hold) End() time.Time {
	end := h.ValidUntil
	for _, t := range []time.Time{h.Unlock, h.LostAt, h.OnLostAt} {
		if !t.IsZero() && (end.IsZero() || t.Before(end)) {
			end = t
		}
	}
	return end
}

// Reported is the earliest loss report, or zero.
func (h Hold) Reported() time.Time {
	switch {
	case h.LostAt.IsZero():
		return h.OnLostAt
	case h.OnLostAt.IsZero() || h.LostAt.Before(h.OnLostAt):
		return h.LostAt
	}
	return h.OnLostAt
}

// Write is one write offered to a register, accepted or refused.
type Write struct {
	Seq      int // order in which the register decided
	Resource string
	Client   int
	Hold     int // the writer's Hold.ID
	Fence    int64
	At       time.Time // read under the register's mutex
	Accepted bool
	Zombie   bool // written by a holder woken from a client pause
}

// Fault is one fault the nemesis injected.
type Fault struct {
	Kind   string
	Nodes  []int // nil for a client fault
	Client int   // -1 for a node fault
	Start  time.Time
	End    time.Time
}

// Sighting is the key of a released lock seen on a node after Unlock had
// returned: read directly from the node (bypassing its proxy) by the
// sampler, with the key's remaining TTL.
type Sighting struct {
	Hold int // the lock's Hold.ID
	Node int
	// At is when the read was sent: the node ran it at At or later.
	At time.Time
	// Age is how long before the read the key was last written (set or
	// re-armed): the lock's TTL minus the key's PTTL, on the node's clock.
	// So the key was written at At − Age or later.
	Age time.Duration
}

// Written is the earliest the key can have been last written.
func (s Sighting) Written() time.Time { return s.At.Add(-s.Age) }

// MajorityLoss marks when a majority of nodes became unreachable at once:
// the last of the nodes had just been paused or cut.
type MajorityLoss struct {
	Kind  string
	Nodes []int
	At    time.Time
	End   time.Time
}

// History is what one run recorded. Its methods are safe for concurrent use.
type History struct {
	start time.Time

	mu       sync.Mutex // protects the fields below
	holds    []*Hold
	byLock   map[*redlock.Lock]*Hold
	onLost   map[*redlock.Lock]time.Time // OnLost calls that came before the hold was registered
	writes   []Write
	faults   []Fault
	majority []MajorityLoss
	seen     []Sighting
	waits    []Wait
	failed   map[string]int // failed Lock calls by outcome
	permits  map[string]int // semaphores: name → K (semaphore.go)
}

// Wait is one Lock call (not TryLock): from its start to its return.
type Wait struct {
	Resource   string
	Start, End time.Time
}

// NewHistory returns an empty history whose clock starts now.
func NewHistory() *History {
	return &History{
		start:  time.Now(),
		byLock: make(map[*redlock.Lock]*Hold),
		onLost: make(map[*redlock.Lock]time.Time),
		failed: make(map[string]int),
	}
}

// begin records a lock Lock just returned, with Valid() and ValidUntil as
// read at start.
func (h *History) begin(client int, l *redlock.Lock, start time.Time, valid bool, validUntil time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := &Hold{ID: len(h.holds), Client: client, Resource: l.Resource(), Fence: l.Fence(), Start: start,
		ValidAtReturn: valid, ValidLeft: validUntil.Sub(start), Shared: l.Mode() == redlock.ModeRead}
	if t, ok := h.onLost[l]; ok {
		hd.OnLostAt = t
		delete(h.onLost, l)
	}
	h.holds = append(h.holds, hd)
	h.byLock[l] = hd
	return hd.ID
}

// lost records that Lost() was seen closed at t.
func (h *History) lost(id int, t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd := h.holds[id]; hd.LostAt.IsZero() {
		hd.LostAt = t
	}
}

// onLostCall records an OnLost callback; it may run before begin.
func (h *History) onLostCall(l *redlock.Lock, t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd, ok := h.byLock[l]; ok {
		if hd.OnLostAt.IsZero() {
			hd.OnLostAt = t
		}
		return
	}
	h.onLost[l] = t
}

// end records the times Unlock was called and returned (zero if never) and
// the final ValidUntil.
func (h *History) end(id int, l *redlock.Lock, unlock, released, validUntil time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.holds[id]
	hd.Unlock, hd.Released, hd.ValidUntil = unlock, released, validUntil
	delete(h.byLock, l)
}

func (h *History) write(w Write) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.Seq = len(h.writes)
	h.writes = append(h.writes, w)
}

func (h *History) fault(f Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, f)
}

func (h *History) majorityLoss(m MajorityLoss) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.majority = append(h.majority, m)
}

func (h *History) sighting(s Sighting) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, s)
}

func (h *History) wait(w Wait) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waits = append(h.waits, w)
}

func (h *History) failedLock(outcome string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed[outcome]++
}

// Snapshot is a copy of a History, the checker's input.
type Snapshot struct {
	Start    time.Time
	Holds    []Hold
	Writes   []Write
	Faults   []Fault
	Majority []MajorityLoss
	Seen     []Sighting
	Waits    []Wait
	Failed   map[string]int
	Permits  map[string]int // semaphores: name → K; their holds are of resources name:permit:…
}

// Snapshot copies what was recorded so far.
func (h *History) Snapshot() Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := Snapshot{
		Start:    h.start,
		Writes:   slices.Clone(h.writes),
		Faults:   slices.Clone(h.faults),
		Majority: slices.Clone(h.majority),
		Seen:     slices.Clone(h.seen),
		Waits:    slices.Clone(h.waits),
		Failed:   make(map[string]int, len(h.failed)),
	}
	for _, hd := range h.holds {
		s.Holds = append(s.Holds, *hd)
	}
	for k, v := range h.failed {
		s.Failed[k] = v
	}
	s.Permits = maps.Clone(h.permits)
	return s
}
