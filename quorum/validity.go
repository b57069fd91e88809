package quorum

import "time"

// ClockDriftMin is the fixed part of the drift allowance: the Redlock
// specification adds 2ms to TTL·drift to cover the granularity of Redis
// expiry (it checks keys with millisecond precision).
const ClockDriftMin = 2 * time.Millisecond

// DriftAllowance returns the part of a lease that is given up to clock drift
// between the client and the nodes: ttl·drift + 2ms (Redlock, step 3).
func DriftAllowance(ttl time.Duration, drift float64) time.Duration {
	return time.Duration(float64(ttl)*drift) + ClockDriftMin
}

// Validity returns how long a lease of ttl, granted by a majority after
// elapsed time (measured with the monotonic clock from before the first
// request was sent), may still be trusted: ttl − elapsed − drift allowance.
// A result ≤ 0 means the lease must be treated as not obtained.
func Validity(ttl, elapsed time.Duration, drift float64) time.Duration {
	return ttl - elapsed - DriftAllowance(ttl, drift)
}

// Deadline returns the local time until which a lease of ttl whose round
// started at start may be trusted: start + ttl − drift allowance. It equals
// decision time + Validity(ttl, decision time − start, drift), and keeps the
// monotonic reading of start, so comparisons with time.Now are immune to
// wall-clock steps.
func Deadline(start time.Time, ttl time.Duration, drift float64) time.Time {
	return start.Add(ttl - DriftAllowance(ttl, drift))
}

// Granted reports whether t, the tally of round r, is a majority whose
// lease of ttl still has validity left (DESIGN step 3: Validity > 0), and
// until when such a lease may be trusted (Deadline from r's start).
func (r *Round[T]) Granted(t Tally, ttl time.Duration, drift float64) (until time.Time, ok bool) {
	allow := DriftAllowance(ttl, drift)
	return r.start.Add(ttl - allow), t.Yes >= Size(len(t.Votes)) && ttl-t.Elapsed-allow > 0
}
