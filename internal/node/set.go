package node

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Set is the nodes of one redlock Client, and what the Client knows of
// them beyond each one's health: that no two are one server (identity.go),
// and each server's clock (clock.go), which bounds every request and sizes
// every release's guard. Call is the one way a request reaches a node of
// the Set.
type Set struct {
	Nodes []Node
	cfg   Config
	ids   idKeys // this Client's identity keys, one per node (identity.go)
}

// Config is what a Set needs of its Client.
type Config struct {
	// Timeout is the Client's node timeout: the bound of its identity
	// checks, probes of a node that is down, and clock probes.
	Timeout time.Duration
	// Drift is the clock drift factor: how much faster or slower one
	// clock may run than another.
	Drift float64
	// KeyPrefix and ID name this Client's identity keys.
	KeyPrefix, ID string
	// Go runs f on a goroutine the Client owns (its Close waits for it);
	// once Close has begun it does not run f and returns the Client's
	// ErrClosed.
	Go func(f func()) error
	// Closing is closed when the Client's Close begins: background loops
	// (the probe of a node that is down) end then.
	Closing <-chan struct{}
	// Invalid returns the Client's error for bad input (its
	// ErrInvalidArgument, with the message): two nodes that reach one
	// server.
	Invalid func(format string, args ...any) error
}

// NewSet returns the Set of clients (no I/O).
func NewSet(clients []redis.UniversalClient, cfg Config) *Set {
	s := &Set{Nodes: make([]Node, len(clients)), cfg: cfg}
	for i, c := range clients {
		s.Nodes[i] = New(c)
		s.Nodes[i].id = newIdentity()
		s.Nodes[i].clock = new(nodeClock)
	}
	return s
}

// Gate returns what Do needs for node i of the Set, for a request sent on
// a client of its own (package election's NewWithNodes): the identity
// check before this Client's first request there (nil once done), and the
// probe to start when the node is found down.
func (s *Set) Gate(i int) (gate func(context.Context) error, down func()) {
	if !s.Nodes[i].id.verified.Load() {
		gate = func(ctx context.Context) error {
			if dup := s.Duplicate(); dup != nil {
				return dup
			}
			return s.identify(ctx, i)
		}
	}
	return gate, func() { s.Probe(i) }
}

// Probe starts the background probe of node i, known down, unless one
// runs: a PING every ProbeEvery until the node answers or the Client
// closes.
func (s *Set) Probe(i int) {
	h := s.Nodes[i].Health
	if !h.StartProbe() {
		return
	}
	timeout := s.cfg.Timeout
	err := s.cfg.Go(func() {
		defer h.EndProbe()
		t := time.NewTicker(ProbeEvery(timeout))
		defer t.Stop()
		for h.Down() != nil {
			select {
			case <-s.cfg.Closing:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := s.Nodes[i].C.Ping(ctx).Err()
			cancel()
			if err == nil {
				h.SetUp()
			}
		}
	})
	if err != nil {
		h.EndProbe()
	}
}
