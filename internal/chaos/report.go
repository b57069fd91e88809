package chaos

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// WriteSummary writes a human-readable summary of outcomes to w.
func WriteSummary(w io.Writer, outcomes []Outcome) {
	pass := 0
	for _, o := range outcomes {
		WriteOutcome(w, o)
		if o.Pass() {
			pass++
		}
	}
	fmt.Fprintf(w, "%d of %d profiles passed\n", pass, len(outcomes))
}

// WriteOutcome writes a human-readable summary of one outcome to w.
func WriteOutcome(w io.Writer, o Outcome) {
	r := o.Result
	kind, want := "safe", "want 0"
	if !o.Safe {
		kind, want = "negative control", "want ≥ 1"
	}
	verdict := "PASS"
	if !o.Pass() {
		verdict = "FAIL"
	}
	line := func(name, format string, args ...any) {
		fmt.Fprintf(w, "  %-24s %s\n", name, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "== %s (%s): %s\n", o.Profile, kind, verdict)
	fmt.Fprintf(w, "  %s\n", o.About)
	line("setup", "%d nodes, %d clients, %d resources, TTL %v, seed %d, ran %v",
		o.Nodes, o.Clients, o.Resources, o.TTL, o.Seed, o.Elapsed.Round(100*time.Millisecond))
	line("acquisitions", "%d; failed Lock calls: %s", r.Acquisitions, counts(r.FailedLocks))
	line("faults injected", "%s", counts(r.Faults))
	line("overlapping holds", "%d%s", r.Overlaps, ifPos(r.Overlaps, ", longest %v", ms(r.MaxOverlap)))
	line("token order violations", "%d", r.TokenOrderViolations)
	line("writes", "%d applied, %d refused", r.Accepted, r.Refused)
	line("stale writes", "%d applied, %d refused", r.StaleAccepted, r.StaleRefused)
	line("writes outside own hold", "%d: %d applied (%d after a takeover, %d unopposed), %d refused",
		r.OutsideHold, r.OutsideAccepted, r.OutsideAcceptedAfterTakes, r.OutsideAcceptedUnopposed, r.OutsideHold-r.OutsideAccepted)
	line("zombie writes", "%d by paused holders, %d refused", r.Zombie, r.ZombieRefused)
	if r.Lost > 0 {
		line("lost-lock reports", "%d (Lost() %d, OnLost %d); %d before ValidUntil (a majority said \"not ours\")",
			r.Lost, r.LostViaChannel, r.LostViaOnLost, r.LostBeforeDeadline)
		if r.LostBeforeDeadline < r.Lost {
			line("", "at expiry: %v median, %v p99, %v max after ValidUntil", ms(r.ExpiryReportP50), ms(r.ExpiryReportP99), ms(r.MaxReportAfterValid))
		}
		line("", "%d late (beyond the slack), %d silent expiries", r.LateReports, r.SilentExpiries)
	} else {
		line("lost-lock reports", "0; %d silent expiries", r.SilentExpiries)
	}
	if r.MajorityEvents > 0 {
		line("majority loss", "%d events; %d holds alive, %d reported lost; report ≤ %v after the loss, validity left ≤ %v, report − validity left ≤ %v",
			r.MajorityEvents, r.MajorityHolds, r.MajorityReported, ms(r.MaxDetect), ms(r.MaxValidityLeft), ms(r.MaxDetectOverLeft))
	}
	line("locks returned", "%d not valid; least validity left at return %v", r.InvalidReturns, ms(r.MinValidLeft))
	line("released keys seen", "%d reappeared%s; %d raced a release in flight%s, %d left by a release not yet landed",
		r.ReleasedKeysReappeared, ifPos(r.ReleasedKeysReappeared, " (%d on a node under a fault when Unlock returned), oldest %v", r.ReappearedAfterNodeFault, ms(r.MaxReappearedAge)),
		r.ReleasedKeysRaced, ifPos(r.ReleasedKeysRaced, " (oldest %v)", ms(r.MaxRacedAge)), r.ReleasedKeysLeft)
	if o.WaitBound > 0 {
		line("handovers", "%d slow; longest from a release to the next hold while a client waited %v (bound %v)",
			r.SlowHandovers, ms(r.MaxHandover), ms(o.WaitBound))
	}
	if r.MaxPermitHolders > 0 {
		line("semaphore holders", "%d holds began with K already held; at most %d at once", r.PermitOverflows, r.MaxPermitHolders)
	}
	line("sampler", "every %v: %d reads of a node, %d failed (node down or paused); %d wake-up messages to raw subscribers",
		o.Sampler.Period, o.Sampler.Reads, o.Sampler.Failed, o.WakeUps)
	line("scheduling delay", "a due timer and the goroutine it woke ran up to %v late (added to the loss reports' slack)", ms(o.Sampler.SchedDelay))
	k := o.KeysLeft
	line("keys left after Close", "%d%s", k.Keys, ifPos(k.Keys, " (%d of held locks, %d of failed attempts; longest TTL %v)", k.OfHeld, k.OfFailed, ms(k.Longest)))
	line("violations", "%d (%s)", r.Violations(), want)
	for _, e := range o.HarnessErrors {
		line("harness error", "%s", e)
	}
	for _, e := range r.Examples {
		fmt.Fprintf(w, "    e.g. %s\n", e)
	}
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func ifPos(n int, format string, args ...any) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// ms rounds d for display: to 0.1ms.
func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
