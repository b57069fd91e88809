package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// maxExamples is how many examples of violations a Result keeps.
const maxExamples = 6

// Result is what the checker found in one history. Durations are measured
// on the run's one monotonic clock.
type Result struct {
	Acquisitions int            `json:"acquisitions"`
	FailedLocks  map[string]int `json:"failed_lock_calls"` // by outcome
	Faults       map[string]int `json:"faults"`            // by kind

	// Mutual exclusion: pairs of holds of one resource whose intervals
	// [Start, End] intersect.
	Overlaps   int           `json:"overlaps"`
	MaxOverlap time.Duration `json:"max_overlap_ns"`
	// Tokens: holds of one resource, in the order they started, whose
	// fencing token is not above every earlier hold's.
	TokenOrderViolations int `json:"token_order_violations"`

	// Writes offered to the register.
	Writes        int `json:"writes"`
	Accepted      int `json:"writes_accepted"`
	Refused       int `json:"writes_refused"`
	StaleAccepted int `json:"stale_writes_accepted"` // token below one applied earlier, yet applied
	StaleRefused  int `json:"stale_writes_refused"`
	// Writes made outside the writer's own hold interval, and of those, the
	// ones applied: after another hold of the resource had started
	// (a violation), or while nobody else had taken the lock (harmless).
	OutsideHold               int `json:"writes_outside_hold"`
	OutsideAccepted           int `json:"writes_outside_hold_accepted"`
	OutsideAcceptedAfterTakes int `json:"writes_outside_hold_accepted_after_takeover"`
	OutsideAcceptedUnopposed  int `json:"writes_outside_hold_accepted_unopposed"`
	// Zombie writes: the writes of holders woken from a client pause.
	Zombie        int `json:"zombie_writes"`
	ZombieRefused int `json:"zombie_writes_refused"`

	// Loss reports.
	Lost                int           `json:"lost"`                            // holds whose loss was reported
	LostViaChannel      int           `json:"lost_via_channel"`                // by Lost()
	LostViaOnLost       int           `json:"lost_via_onlost"`                 // by OnLost
	LostBeforeDeadline  int           `json:"lost_before_deadline"`            // reported before ValidUntil: a majority said "not ours"
	MaxReportAfterValid time.Duration `json:"max_report_after_valid_until_ns"` // latest report, relative to ValidUntil
	// Of the reports at or after ValidUntil (the lease ran out), how long
	// after it: median and 99th percentile.
	ExpiryReportP50 time.Duration `json:"expiry_report_p50_ns"`
	ExpiryReportP99 time.Duration `json:"expiry_report_p99_ns"`
	LateReports     int           `json:"late_reports"`    // reported more than the slack after ValidUntil
	SilentExpiries  int           `json:"silent_expiries"` // ValidUntil passed by more than the slack, no report, not unlocked

	// Majority loss (profiles whose nemesis hits a majority): for holds alive
	// at the moment the majority went away.
	MajorityEvents    int           `json:"majority_events"`
	MajorityHolds     int           `json:"majority_holds"`          // holds alive then
	MajorityReported  int           `json:"majority_holds_reported"` // of which reported lost
	MaxDetect         time.Duration `json:"max_detect_ns"`           // report − majority loss
	MaxValidityLeft   time.Duration `json:"max_validity_left_ns"`    // ValidUntil − majority loss
	MaxDetectOverLeft time.Duration `json:"max_detect_minus_validity_left_ns"`

	// Lock and TryLock must never return a lock that is not valid: holds
	// whose Valid() was false right when Lock returned (a violation), and
	// the least validity left then.
	InvalidReturns int           `json:"invalid_returns"`
	MinValidLeft   time.Duration `json:"min_validity_left_at_return_ns"`

	// Keys of released locks seen on a node after Unlock had returned,
	// counted once per hold and node (see Sighting):
	//   - left: last written before the release returned (plus the
	//     settle): the release had not landed there yet (a slow, paused or
	//     cut node) and the key expires with its TTL;
	//   - raced: written later, but never seen as old as CheckOptions.Persist:
	//     a late request of ours landed just before a release still in
	//     flight behind it, which then deleted the key;
	//   - reappeared: written after the release returned (plus the settle),
	//     and seen as old as Persist counted from when it was written or,
	//     on a node under a fault since the release, from the fault's end
	//     (when the release's retries can reach the node again): a request
	//     of ours set the key again after the release, and it stayed. A
	//     violation.
	ReleasedKeysLeft       int           `json:"released_keys_left"`
	ReleasedKeysRaced      int           `json:"released_keys_raced"`
	MaxRacedAge            time.Duration `json:"max_raced_age_ns"` // the oldest a raced key was seen
	ReleasedKeysReappeared int           `json:"released_keys_reappeared"`
	MaxReappearedAge       time.Duration `json:"max_reappeared_age_ns"`
	// Of the reappeared keys, those on a node under a fault (paused, cut,
	// killed) when Unlock returned, so that the release could not reach it.
	ReappearedAfterNodeFault int `json:"released_keys_reappeared_after_node_fault"`

	// Liveness (with CheckOptions.WaitBound): releases (an Unlock that
	// returned) after which no hold of the resource began within the
	// bound although a client was waiting in Lock on it the whole time (a
	// violation), and the longest time from a release to the next hold
	// while someone waited.
	SlowHandovers int           `json:"slow_handovers"`
	MaxHandover   time.Duration `json:"max_handover_ns"`

	// Semaphores (Snapshot.Permits): the holds that began while K holds of
	// the semaphore's permits were alive (a violation), and the most alive
	// at once.
	PermitOverflows  int `json:"permit_overflows"`
	MaxPermitHolders int `json:"max_permit_holders"`

	Examples []string `json:"examples,omitempty"`
}

// Violations is the number of violations: of safety (overlapping holds,
// tokens out of order, stale writes applied, writes applied outside the
// writer's hold after another client took the lock, keys of released locks
// that reappeared), of loss detection (reports later than the slack after
// ValidUntil, expiries never reported), and locks returned not valid.
func (r Result) Violations() int {
	return r.Overlaps + r.TokenOrderViolations + r.StaleAccepted + r.OutsideAcceptedAfterTakes +
		r.LateReports + r.SilentExpiries + r.InvalidReturns + r.ReleasedKeysReappeared + r.SlowHandovers + r.PermitOverflows
}

// CheckOptions tune the checker.
type CheckOptions struct {
	// Slack is how late a loss report may come after ValidUntil before it
	// counts as late: scheduling delay on a loaded machine. A report missed
	// by the deadline timer would come a renewal interval (TTL/3) late or
	// never, so Run uses TTL/3, at least 100ms. Default 100ms.
	Slack time.Duration
	// Settle is how long after Unlock returned a write of the lock's key
	// still counts as racing the release. Default 20ms.
	Settle time.Duration
	// Persist is how old a key written after the release (plus Settle)
	// must be seen to have reappeared, rather than to have raced a release
	// still in flight behind it. Keys set again by a late request live a
	// whole TTL; Run uses TTL/2. Default 100ms.
	Persist time.Duration
	// Unreachable replaces Persist for a key on a node that was
	// unreachable (paused, cut, killed) since the release. A request of
	// ours that such a node held runs when it comes back; its not-after
	// bound (DESIGN step 4) has passed by then unless it came back within
	// the bound's error of the request's deadline, and the release's guard
	// covers that window, so no extra allowance is due: Run leaves it at
	// the default. A library without the bounds needs one TTL here (the
	// key set again lives that long). Default: Persist.
	Unreachable time.Duration
	// WaitBound, when positive, is the longest a release may be followed
	// by no new hold of its resource while a client waited in Lock on it
	// from before the release until the bound (DESIGN step 9: a frozen
	// waiter delays the next by one reservation). Zero: not checked.
	WaitBound time.Duration
}

// Check checks a history:
//
//   - holds are intervals [Start, End], End = min(Unlock, Lost(), OnLost,
//     ValidUntil); two holds of one resource that intersect are an overlap,
//     unless both are read locks (Hold.Shared);
//
//   - sorted by Start, each hold's fencing token must exceed every earlier
//     hold's of the same resource (when tokens are in use);
//
//   - replaying the register's writes in their order, a write applied with
//     a token below one applied before it is a stale write;
//
//   - a write whose time is outside its writer's own hold is outside; if it
//     was applied although another hold of the resource had started since
//     the writer's own, it is a violation.
//
//   - Lock must have returned each hold's lock valid;
//
//   - a key of a released lock that the sampler saw, written after Unlock
//     returned (plus the settle) and as old as Persist, reappeared.
//
// It also measures loss reports against ValidUntil and, for majority-loss
// events, the time from the event to each report.
func Check(s Snapshot, o CheckOptions) Result {
	if o.Slack <= 0 {
		o.Slack = 100 * time.Millisecond
	}
	if o.Settle <= 0 {
		o.Settle = 20 * time.Millisecond
	}
	if o.Persist <= 0 {
		o.Persist = 100 * time.Millisecond
	}
	if o.Unreachable <= 0 {
		o.Unreachable = o.Persist
	}
	r := Result{Acquisitions: len(s.Holds), FailedLocks: s.Failed, Faults: make(map[string]int)}
	for _, f := range s.Faults {
		r.Faults[f.Kind]++
	}
	rel := func(t time.Time) string { return t.Sub(s.Start).Round(time.Microsecond).String() }
	example := func(format string, args ...any) {
		if len(r.Examples) < maxExamples {
			r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
		}
	}

	byRes := make(map[string][]Hold)
	for _, h := range s.Holds {
		byRes[h.Resource] = append(byRes[h.Resource], h)
	}
	resources := make([]string, 0, len(byRes))
	for res := range byRes {
		resources = append(resources, res)
	}
	slices.Sort(resources)

	// Overlaps and token order, per resource, holds sorted by start.
	for _, res := range resources {
		hs := byRes[res]
		slices.SortFunc(hs, func(a, b Hold) int { return a.Start.Compare(b.Start) })
		var top int64
		for i, a := range hs {
			if a.Shared {
				// Readers have no fence; they are not in the token order.
			} else if a.Fence != 0 || top != 0 {
				if i > 0 && a.Fence <= top {
					r.TokenOrderViolations++
					example("token order: %s hold %d (client %d) started %s with token %d, not above %d",
						res, a.ID, a.Client, rel(a.Start), a.Fence, top)
				}
				top = max(top, a.Fence)
			}
			aEnd := a.End()
			for _, b := range hs[i+1:] {
				if !b.Start.Before(aEnd) {
					break // sorted by start: no later hold can overlap a
				}
				if b.End().Before(b.Start) || (a.Shared && b.Shared) {
					continue // readers share (rwlock profiles)
				}
				r.Overlaps++
				d := earlier(aEnd, b.End()).Sub(b.Start)
				r.MaxOverlap = max(r.MaxOverlap, d)
				example("overlap: %s hold %d (client %d, token %d) [%s, %s] and hold %d (client %d, token %d) [%s, %s]: %v",
					res, a.ID, a.Client, a.Fence, rel(a.Start), rel(aEnd), b.ID, b.Client, b.Fence, rel(b.Start), rel(b.End()), d)
			}
		}
	}

	// Writes, in the register's order.
	holds := make(map[int]Hold, len(s.Holds))
	for _, h := range s.Holds {
		holds[h.ID] = h
	}
	applied := make(map[string]int64)
	for _, w := range s.Writes {
		r.Writes++
		if w.Accepted {
			r.Accepted++
		} else {
			r.Refused++
		}
		stale := w.Fence < applied[w.Resource]
		switch {
		case stale && w.Accepted:
			r.StaleAccepted++
			example("stale write applied: %s by client %d at %s with token %d after token %d", w.Resource, w.Client, rel(w.At), w.Fence, applied[w.Resource])
		case stale:
			r.StaleRefused++
		}
		if w.Accepted {
			applied[w.Resource] = max(applied[w.Resource], w.Fence)
		}
		if w.Zombie {
			r.Zombie++
			if !w.Accepted {
				r.ZombieRefused++
			}
		}
		own, ok := holds[w.Hold]
		if ok && !w.At.Before(own.Start) && !w.At.After(own.End()) {
			continue
		}
		r.OutsideHold++
		if !w.Accepted {
			continue
		}
		r.OutsideAccepted++
		taken := false
		for _, b := range byRes[w.Resource] {
			if b.ID != w.Hold && b.Start.After(own.Start) && !b.Start.After(w.At) {
				taken = true
				break
			}
		}
		if taken {
			r.OutsideAcceptedAfterTakes++
			example("write applied outside its hold after a takeover: %s by client %d (hold %d, token %d, ended %s) at %s",
				w.Resource, w.Client, w.Hold, w.Fence, rel(own.End()), rel(w.At))
		} else {
			r.OutsideAcceptedUnopposed++
		}
	}

	// Locks returned not valid.
	for i, h := range s.Holds {
		if i == 0 || h.ValidLeft < r.MinValidLeft {
			r.MinValidLeft = h.ValidLeft
		}
		if !h.ValidAtReturn {
			r.InvalidReturns++
			example("lock returned not valid: %s hold %d (client %d) at %s, validity left %v",
				h.Resource, h.ID, h.Client, rel(h.Start), h.ValidLeft)
		}
	}

	r.checkSightings(s, o, holds, rel, example)
	r.checkPermits(s, rel, example) // semaphore.go

	// Loss reports.
	var afterExpiry []time.Duration
	for _, h := range s.Holds {
		rep := h.Reported()
		if !h.LostAt.IsZero() {
			r.LostViaChannel++
		}
		if !h.OnLostAt.IsZero() {
			r.LostViaOnLost++
		}
		if rep.IsZero() {
			if !h.ValidUntil.IsZero() && (h.Unlock.IsZero() || h.Unlock.Sub(h.ValidUntil) > o.Slack) {
				r.SilentExpiries++
				example("silent expiry: %s hold %d (client %d) valid until %s, unlocked %s, no loss report",
					h.Resource, h.ID, h.Client, rel(h.ValidUntil), rel(h.Unlock))
			}
			continue
		}
		r.Lost++
		late := rep.Sub(h.ValidUntil)
		if r.Lost == 1 || late > r.MaxReportAfterValid {
			r.MaxReportAfterValid = late
		}
		if late < 0 {
			r.LostBeforeDeadline++
		} else {
			afterExpiry = append(afterExpiry, late)
		}
		if late > o.Slack {
			r.LateReports++
			example("late loss report: %s hold %d (client %d) valid until %s, reported %s (%v late)",
				h.Resource, h.ID, h.Client, rel(h.ValidUntil), rel(rep), late)
		}
	}

	if len(afterExpiry) > 0 {
		slices.Sort(afterExpiry)
		r.ExpiryReportP50 = afterExpiry[len(afterExpiry)/2]
		r.ExpiryReportP99 = afterExpiry[(len(afterExpiry)*99)/100]
	}

	if o.WaitBound > 0 {
		r.checkHandovers(s, o, byRes, rel, example)
	}

	// Majority loss: holds alive at the event.
	for _, m := range s.Majority {
		r.MajorityEvents++
		for _, h := range s.Holds {
			if !h.Start.Before(m.At) || !h.End().After(m.At) {
				continue // not held when the majority went away
			}
			r.MajorityHolds++
			left := h.ValidUntil.Sub(m.At)
			r.MaxValidityLeft = max(r.MaxValidityLeft, left)
			rep := h.Reported()
			if rep.IsZero() {
				continue // unlocked before it was lost: the run ended
			}
			r.MajorityReported++
			detect := rep.Sub(m.At)
			r.MaxDetect = max(r.MaxDetect, detect)
			if r.MajorityReported == 1 || detect-left > r.MaxDetectOverLeft {
				r.MaxDetectOverLeft = detect - left
			}
		}
	}
	return r
}

// checkSightings sorts the sampler's sightings of released keys, per hold
// and node, into left, raced and reappeared.
func (r *Result) checkSightings(s Snapshot, o CheckOptions, holds map[int]Hold, rel func(time.Time) string, example func(string, ...any)) {
	type place struct{ hold, node int }
	const (
		left = iota
		raced
		reappeared
	)
	worst := make(map[place]int)
	var order []place
	faulty := make(map[place]bool) // the node was under a fault when the release returned
	racedAge := make(map[place]time.Duration)
	for _, x := range s.Seen {
		h, ok := holds[x.Hold]
		if !ok || h.Released.IsZero() || !x.At.After(h.Released) {
			continue
		}
		p := place{x.Hold, x.Node}
		kind := left
		if x.Written().After(h.Released.Add(o.Settle)) {
			kind = raced
			racedAge[p] = max(racedAge[p], x.Age)
			// A node under a fault (paused, cut, delayed) cannot be
			// reached by the release's retries; a request of ours that it
			// runs when the fault ends may set the key again. The promise
			// is that the retries remove it soon after the node is
			// reachable again: the key's age counts from then. (A node
			// resumed from SIGSTOP may also report a PTTL as if the key
			// had been written during the pause.)
			//
			// Nor can a releasing client that is paused (client-pause:
			// its commands wait at its gate) send a retry; meanwhile a
			// release of another client may hand the key to our token
			// where our release has not landed (our queue entry is still
			// there). The retries remove it soon after the client runs
			// again, so its pause counts as a fault too.
			since, allow := x.Written(), o.Persist
			for _, f := range s.Faults {
				ours := f.Kind == KindClientPause && f.Client == h.Client
				if (ours || slices.Contains(f.Nodes, x.Node)) && f.Start.Before(x.At) && f.End.After(h.Released) {
					if f.End.After(x.At) {
						since = x.At // still under the fault
					} else if f.End.After(since) {
						since = f.End
					}
					// A node that was unreachable (paused, cut, killed), or
					// slowed past the node timeout (latency: the Client
					// then holds back its requests, releases too, until it
					// answers, at most a second: internal/node/health.go), gets our
					// release late. Until it lands, our queue entry is still
					// there, and another client's release may hand the key
					// to our finished token, for one reservation (it is
					// never renewed): Unreachable is that allowance. The
					// requests of ours the node held change nothing when
					// they run (their not-after bounds); latency spikes
					// (late-requests) get no allowance, so that a late
					// request that did set the key is still seen.
					if f.Kind != KindSpike && !ours {
						allow = max(allow, o.Unreachable)
					}
				}
			}
			if x.At.Sub(since) >= allow {
				kind = reappeared
				if x.Age > r.MaxReappearedAge {
					r.MaxReappearedAge = x.Age
				}
			}
		}
		prev, seen := worst[p]
		if !seen {
			order = append(order, p)
		} else if kind <= prev {
			continue
		}
		worst[p] = kind
		if kind == reappeared {
			// The faults on that node or client during the hold and
			// since, which delayed the request that came late.
			var fs []string
			for _, f := range s.Faults {
				if (slices.Contains(f.Nodes, x.Node) || f.Client == h.Client) && !f.End.Before(h.Start) && !f.Start.After(x.At) {
					fs = append(fs, fmt.Sprintf("%s [%s, %s]", f.Kind, rel(f.Start), rel(f.End)))
				}
				if slices.Contains(f.Nodes, x.Node) && f.Start.Before(h.Released) && f.End.After(h.Released) {
					faulty[p] = true
				}
			}
			example("key reappeared: %s hold %d (client %d) [%s, unlocked %s, released %s], seen on node %d at %s, written again at %s or later; faults on the node or client: %s",
				h.Resource, h.ID, h.Client, rel(h.Start), rel(h.Unlock), rel(h.Released), x.Node, rel(x.At), rel(x.Written()), strings.Join(fs, ", "))
		}
	}
	for _, p := range order {
		switch worst[p] {
		case left:
			r.ReleasedKeysLeft++
		case raced:
			r.ReleasedKeysRaced++
			r.MaxRacedAge = max(r.MaxRacedAge, racedAge[p])
		case reappeared:
			r.ReleasedKeysReappeared++
			if faulty[p] {
				r.ReappearedAfterNodeFault++
			}
		}
	}
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// checkHandovers measures, for every release (an Unlock that returned) of a
// resource while a client waited in Lock on it, the time to the next hold
// of it; more than o.WaitBound, with a client still waiting then, is a
// slow handover.
func (r *Result) checkHandovers(s Snapshot, o CheckOptions, byRes map[string][]Hold, rel func(time.Time) string, example func(string, ...any)) {
	waits := make(map[string][]Wait)
	for _, w := range s.Waits {
		waits[w.Resource] = append(waits[w.Resource], w)
	}
	for res, hs := range byRes { // sorted by Start above
		for _, h := range hs {
			u := h.Released
			if u.IsZero() || !h.Reported().IsZero() {
				continue // never released, or lost: its key expired by itself
			}
			waiting, stayed := false, false // a client waited at u; one still waited at u + bound
			for _, w := range waits[res] {
				if w.Start.Before(u) && w.End.After(u) {
					waiting = true
					stayed = stayed || !w.End.Before(u.Add(o.WaitBound))
				}
			}
			if !waiting {
				continue
			}
			i, _ := slices.BinarySearchFunc(hs, u, func(a Hold, t time.Time) int { return a.Start.Compare(t) })
			next := time.Duration(-1)
			if i < len(hs) {
				next = hs[i].Start.Sub(u)
			}
			if next >= 0 {
				r.MaxHandover = max(r.MaxHandover, next)
			}
			if stayed && (next < 0 || next > o.WaitBound) {
				r.SlowHandovers++
				example("slow handover: %s released by hold %d at %s, next hold %v later (bound %v) while a client waited in Lock",
					res, h.ID, rel(u), next, o.WaitBound)
			}
		}
	}
}
