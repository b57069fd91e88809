package chaos

import (
	"sync"
	"time"
)

// Register is the shared resource the clients protect with the lock: one
// value per resource, kept in this process. A fenced register applies a
// write only if its token is at least the highest token it has seen for that
// resource (the rule of redlock.FencedSet); an unfenced one applies every
// write, as a store that knows nothing of fencing would. Every write offered,
// applied or refused, is recorded in the History with the time the register
// decided, under its mutex, so writes are totally ordered on the run's clock.
type Register struct {
	fenced bool
	h      *History

	mu      sync.Mutex       // protects highest
	highest map[string]int64 // per resource: highest token offered (fenced: applied)
}

// NewRegister returns an empty register that records into h.
func NewRegister(h *History, fenced bool) *Register {
	return &Register{fenced: fenced, h: h, highest: make(map[string]int64)}
}

// Write offers a write to resource by the holder of hold, with its fencing
// token, and reports whether it was applied.
func (r *Register) Write(resource string, client, hold int, token int64, zombie bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := !r.fenced || token >= r.highest[resource]
	if ok {
		r.highest[resource] = max(r.highest[resource], token)
	}
	r.h.write(Write{Resource: resource, Client: client, Hold: hold, Fence: token, At: time.Now(), Accepted: ok, Zombie: zombie})
	return ok
}

// Highest returns the highest token applied to resource so far.
func (r *Register) Highest(resource string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.highest[resource]
}
