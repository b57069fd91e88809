package redlockprom

import (
	"strings"
	"sync"
)

// ResourceLabelLimit is how many distinct values the resource label takes
// at most, per Hooks, unless [WithFullResourceLabel] is set: the first
// ResourceLabelLimit values seen keep their own series, and locks on any
// other value are counted under [OtherResource]. It bounds the series a
// Hooks can make whatever the resource names (the default mapping keeps
// names without ":" whole) and whatever a [WithResourceLabel] function
// returns.
const ResourceLabelLimit = 100

// OtherResource is the resource label of locks whose label value came after
// the first [ResourceLabelLimit] distinct values.
const OtherResource = "_other"

// ResourcePrefix returns a mapping for WithResourceLabel that keeps the part
// of a resource name before the first sep: with ":", "invoice:1234" becomes
// "invoice". A name without sep is kept whole. ResourcePrefix(":") is the
// default mapping.
func ResourcePrefix(sep string) func(string) string {
	return func(resource string) string {
		prefix, _, _ := strings.Cut(resource, sep)
		return prefix
	}
}

// labeler maps resource names to resource label values, admitting at most
// limit distinct values (limit 0: no bound). A value once admitted stays
// admitted and a value once refused stays refused, so a lock's events
// always land on one series (the held gauge goes up and down on the same
// one).
type labeler struct {
	f     func(string) string
	limit int

	mu   sync.RWMutex
	seen map[string]struct{} // protected by mu: the admitted values
}

func newLabeler(f func(string) string, limit int) *labeler {
	return &labeler{f: f, limit: limit, seen: map[string]struct{}{}}
}

func (l *labeler) value(resource string) string {
	v := l.f(resource)
	if l.limit <= 0 {
		return v
	}
	l.mu.RLock()
	_, ok := l.seen[v]
	l.mu.RUnlock()
	if ok {
		return v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.limit {
		return OtherResource
	}
	l.seen[v] = struct{}{}
	return v
}
