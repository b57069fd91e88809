// Package libs puts the lock libraries compared by the benchmarks behind one
// small interface, so that every scenario runs the same code for each of
// them: quorumlock, go-redsync/redsync v4, bsm/redislock, and the floor (one
// parallel round of plain commands, no lock library at all).
//
// The adapters add no allocation for quorumlock and redsync (their lock
// values satisfy [Held] through a pointer conversion) and one small one for
// redislock, whose Refresh needs the TTL carried along.
package libs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Default retry delay bounds shared by every library that retries: the
// defaults of both quorumlock (redlock.DefaultRetryDelayMin/Max) and
// redsync (50ms..250ms, jittered), so that waiting is compared like for like.
const (
	RetryMin = 50 * time.Millisecond
	RetryMax = 250 * time.Millisecond
)

// ErrNotObtained is returned by a Locker when the lock is held by another
// owner and it will not wait (the floor never waits).
var ErrNotObtained = errors.New("libs: not obtained")

// Locker acquires locks with one library over a fixed set of nodes.
type Locker interface {
	// Lock acquires resource, retrying with the library's own retry delay
	// until it is acquired or ctx is done.
	Lock(ctx context.Context, resource string) (Held, error)
	// Close releases what the library holds and stops its goroutines. It
	// does not close the node clients.
	Close() error
}

// Held is an acquired lock.
type Held interface {
	Extend(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// Lib describes one library.
type Lib struct {
	Name string
	// About is a short description for tables and legends.
	About string
	// MaxNodes caps the nodes the library is given (0: all): redislock is a
	// single-node lock, measured on node 0 only.
	MaxNodes int
	// Waits reports whether Lock waits for a held lock. The floor does not,
	// so it takes no part in contention scenarios.
	Waits bool
	// Variant marks a second configuration of a library already listed
	// (quorumlock+poll): "all" leaves it out, naming it selects it, so
	// that a default run keeps its length.
	Variant bool
	// New builds a Locker over nodes with lease ttl.
	New func(nodes []redis.UniversalClient, ttl time.Duration) (Locker, error)
}

// Nodes returns the nodes the library uses out of nodes.
func (l Lib) Nodes(nodes []redis.UniversalClient) []redis.UniversalClient {
	if l.MaxNodes > 0 && len(nodes) > l.MaxNodes {
		return nodes[:l.MaxNodes]
	}
	return nodes
}

// All lists the libraries in the order tables show them. A row for a
// variant goes here: a "quorumlock+fence" entry built with
// redlock.WithFencing(true), for instance (fencing has no row yet).
// quorumlock's wake-up on release shows up in the handoff and contended
// scenarios without an entry of its own; quorumlock+poll is the same
// library with it off (redlock.WithWakeUp(false): no queue, plain polling
// like redsync's), selected only by name.
var All = []Lib{
	{Name: "quorumlock", About: "quorumlock (this module)", Waits: true, New: newQuorumlock},
	{Name: "quorumlock+poll", About: "quorumlock with WithWakeUp(false): no queue, polling", Waits: true, Variant: true, New: newQuorumlockPoll},
	{Name: "redsync", About: "go-redsync/redsync v4 (goredis v9 pool)", Waits: true, New: newRedsync},
	{Name: "redislock", About: "bsm/redislock (single node)", MaxNodes: 1, Waits: true, New: newRedislock},
	{Name: "floor", About: "plain SET NX PX / DEL, one parallel round", New: newFloor},
}

// Names returns the names of All.
func Names() []string {
	names := make([]string, len(All))
	for i, l := range All {
		names[i] = l.Name
	}
	return names
}

// Select returns the libraries named in a comma-separated list, in the
// order of All; "all" or "" selects every one but the variants.
func Select(list string) ([]Lib, error) {
	if list == "" || list == "all" {
		var out []Lib
		for _, l := range All {
			if !l.Variant {
				out = append(out, l)
			}
		}
		return out, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(Names(), n) {
			return nil, fmt.Errorf("unknown library %q (have %s)", n, strings.Join(Names(), ", "))
		}
		want[n] = true
	}
	var out []Lib
	for _, l := range All {
		if want[l.Name] {
			out = append(out, l)
		}
	}
	return out, nil
}

// ByName returns the library called name.
func ByName(name string) (Lib, bool) {
	for _, l := range All {
		if l.Name == name {
			return l, true
		}
	}
	return Lib{}, false
}

// jitter returns a delay drawn uniformly from [RetryMin, RetryMax).
func jitter() time.Duration {
	return RetryMin + rand.N(RetryMax-RetryMin)
}
