package sim

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// cluster is N miniredis nodes behind the fault layer, and per simulated
// process (a redlock.Client) one go-redis client per node whose Dialer
// returns the client end of a pipe through the layer.
type cluster struct {
	net *network

	// Each node's clock (issue 33): the bubble's fake clock, run at its
	// own rate (1 + drift) from the run's start, plus an offset. Keys
	// expire by it and TIME reads it (inside the scripts too): miniredis
	// is set to it before every command (a pre-hook) and before the
	// sampler reads a node.
	base   time.Time
	drift  []float64
	offset []time.Duration

	mu    sync.Mutex             // protects nodes
	nodes []*miniredis.Miniredis // nil while killed
	// dialMu orders a node's Dial (which starts its server after a kill)
	// and the pre-hook set on that server with kill's Close.
	dialMu sync.Mutex
}

func newCluster(seed uint64, clients, nodes int, drift []float64, offset []time.Duration) *cluster {
	cl := &cluster{nodes: make([]*miniredis.Miniredis, nodes), base: time.Now(),
		drift: make([]float64, nodes), offset: make([]time.Duration, nodes)}
	copy(cl.drift, drift)
	copy(cl.offset, offset)
	for i := range nodes {
		cl.nodes[i] = cl.newNode(i)
	}
	cl.net = newNetwork(seed, clients, nodes, cl.serve)
	return cl
}

// newNode is an empty node i whose keys expire by its clock (nodeTime),
// as do TIME and the scripts' reading of it.
func (cl *cluster) newNode(i int) *miniredis.Miniredis {
	m := miniredis.NewMiniRedis()
	m.SetTime(cl.nodeTime(i))
	m.ClockTTL(true)
	return m
}

// nodeTime is node i's clock now.
func (cl *cluster) nodeTime(i int) time.Time {
	el := time.Since(cl.base)
	return cl.base.Add(el + time.Duration(float64(el)*cl.drift[i]) + cl.offset[i])
}

// clientDur is how long d of node i's clock lasts on the bubble's clock.
func (cl *cluster) clientDur(i int, d time.Duration) time.Duration {
	return time.Duration(float64(d) / (1 + cl.drift[i]))
}

// tick sets node i's miniredis m to its clock (its TTLs run to now).
func (cl *cluster) tick(i int, m *miniredis.Miniredis) { m.SetTime(cl.nodeTime(i)) }

// serve returns the server end of a new connection to node i.
func (cl *cluster) serve(i int) (net.Conn, error) {
	cl.mu.Lock()
	m := cl.nodes[i]
	cl.mu.Unlock()
	if m == nil {
		return nil, errRefused
	}
	cl.dialMu.Lock()
	defer cl.dialMu.Unlock()
	c, err := m.Dial()
	if err == nil {
		// Dial starts the server after a kill's Close: set the hook on
		// whichever server this is (setting it again is harmless).
		// A script's own commands pass through the hook too, with m
		// locked by the script (TryLock fails): they keep the time set
		// for the script. Another connection's command holding m is
		// the same case: fake time cannot advance while a goroutine
		// waits on a mutex, so the time it set is now.
		m.Server().SetPreHook(func(*server.Peer, string, ...string) bool {
			if m.TryLock() {
				m.Unlock()
				cl.tick(i, m)
			}
			return false
		})
	}
	return c, err
}

// node returns node i, nil while it is killed.
func (cl *cluster) node(i int) *miniredis.Miniredis {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.nodes[i]
}

// kill stops node i: its connections reset, dials refused. With wipe its
// data is gone; else it is kept for the restart (appendfsync always).
func (cl *cluster) kill(i int, wipe bool) {
	cl.net.setDown(i, true)
	cl.mu.Lock()
	m := cl.nodes[i]
	if wipe {
		cl.nodes[i] = nil
	}
	cl.mu.Unlock()
	if m != nil {
		cl.dialMu.Lock()
		m.Close()
		cl.dialMu.Unlock()
	}
}

// restart brings node i back, empty if it was wiped.
func (cl *cluster) restart(i int) {
	cl.mu.Lock()
	if cl.nodes[i] == nil {
		cl.nodes[i] = cl.newNode(i)
	}
	cl.mu.Unlock()
	cl.net.setDown(i, false)
}

// clients returns client c's node clients (one per node), each from
// nodeOptions and queueing its commands in turns.
func (cl *cluster) clients(c int) []redis.UniversalClient {
	out := make([]redis.UniversalClient, len(cl.nodes))
	for i := range cl.nodes {
		nc := redis.NewClient(cl.nodeOptions(c, i))
		nc.AddHook(&turns{ch: make(chan struct{}, turnLimit), wait: 2 * time.Second}) // go-redis's PoolTimeout here
		out[i] = nc
	}
	return out
}

// nodeOptions are client c's options for node i: a small pool, no retries
// (a retry would hide a reset from the library, which must see it), and
// ContextTimeoutEnabled, as the README asks.
func (cl *cluster) nodeOptions(c, i int) *redis.Options {
	return &redis.Options{
		// An IP literal on a port nothing listens on: the Dialer below
		// ignores it, but the library dials it itself in one place
		// (internal/node ForgetIdentity's reachable, when a DEL at Close
		// gets no answer), and a host name there is a DNS lookup, whose
		// resolver state is shared outside the bubble ("send on synctest
		// channel from outside bubble", a 3,000-seed run at 7886032).
		// The loopback refuses it at once, as the name did not resolve.
		Addr:                  fmt.Sprintf("127.0.0.1:%d", 1+i),
		Dialer:                func(ctx context.Context, _, _ string) (net.Conn, error) { return cl.net.dial(ctx, c, i) },
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              poolSize,
		MaxConcurrentDials:    maxDials,
		DisableIdentity:       true,
		Protocol:              2,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		// Maintenance notifications resolve the host name (a DNS
		// lookup: not in a bubble) and need RESP3.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// A node client runs at most turnLimit commands at once: go-redis waits
// for a turn of its pool on a timer taken from a process-wide sync.Pool,
// and a timer made in one bubble and used in another is a fatal "select on
// synctest channel from outside bubble" (a soak at cfb2635 died of it once
// in about 4,500 seeds, a node client with all 16 turns taken). So the
// simulator queues commands before the pool, on a channel of the bubble
// (turns), and the pool always has a free turn: commands hold at most
// turnLimit, and dials that go-redis finishes in the background for a
// caller that gave up at most maxDials more.
const (
	poolSize  = 16
	turnLimit = 8
	maxDials  = 4
)

// turns is the redis.Hook that queues a node client's commands.
type turns struct {
	ch   chan struct{}
	wait time.Duration
}

// take waits for a turn, at most t.wait and until ctx ends, as go-redis's
// pool does, and returns the function that gives it back.
func (t *turns) take(ctx context.Context) (func(), error) {
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch }, nil
	default:
	}
	tm := time.NewTimer(t.wait)
	defer tm.Stop()
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-tm.C:
		return nil, redis.ErrPoolTimeout
	}
}

func (t *turns) DialHook(next redis.DialHook) redis.DialHook { return next }

// handshake reports whether cmd is one of the commands go-redis sends to
// set up a new connection (HELLO, and AUTH, SELECT, CLIENT, READONLY when
// configured), which pass through the client's hooks too: the command that
// needed the connection holds a turn already, and a handshake waiting for
// another would stall every dial while all turns are taken by commands
// waiting for theirs. The library sends none of them.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "auth", "select", "client", "readonly":
		return true
	}
	return false
}

func (t *turns) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if handshake(cmd) {
			return next(ctx, cmd)
		}
		done, err := t.take(ctx)
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		defer done()
		return next(ctx, cmd)
	}
}

func (t *turns) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !handshake(c) }) {
			return next(ctx, cmds) // a handshake's pipeline
		}
		done, err := t.take(ctx)
		if err != nil {
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		defer done()
		return next(ctx, cmds)
	}
}

// close closes the network and every node.
func (cl *cluster) close() {
	cl.net.close()
	cl.mu.Lock()
	ns := cl.nodes
	cl.nodes = make([]*miniredis.Miniredis, len(ns))
	cl.mu.Unlock()
	for _, m := range ns {
		if m != nil {
			m.Close()
		}
	}
}
