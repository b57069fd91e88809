package redlockprom

import "time"

// SetClock makes h read the time from now (tests of NodeFailureWindow).
func SetClock(h *Hooks, now func() time.Time) { h.nodes.now = now }
