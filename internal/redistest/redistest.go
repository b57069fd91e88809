// Package redistest runs real redis-server processes for tests and injects
// the faults a Redlock client must survive: a node killed, paused (SIGSTOP),
// restarted empty, slowed down, or cut off from the network.
//
// Each node is a redis-server on 127.0.0.1, fronted by a [Proxy] of our own.
// Lock clients connect to the proxy ([Cluster.Addr], [Cluster.Client]), so
// network faults apply to them; [Cluster.Admin] talks to the server directly,
// for inspecting keys. Start with [Start] in tests, or [StartCluster]
// elsewhere.
//
// Servers keep no data on disk (no RDB snapshots, no AOF), only ever listen
// on 127.0.0.1, and are stopped by PID: nothing else on the machine is
// touched. The package needs redis-server on PATH; see [Available].
package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	// InstallHint is the command that installs redis-server on Debian and
	// Ubuntu, named by the skip message and by ErrNoRedisServer.
	InstallHint = "apt-get install -y redis-server"

	// ClientDialTimeout is the DialTimeout of clients made by Client,
	// Clients and Admin. It does not hide faults: a dial to a proxy always
	// completes at once (Kill and Cut show up as resets, Pause as a read
	// that hangs), and a ctx deadline, which these clients honour, cuts it
	// shorter. It is not shorter itself because 200ms proved too little for
	// a local dial when many -race test binaries share two CPUs.
	ClientDialTimeout = time.Second

	// startAttempts is how many ports a server tries before giving up,
	// when other programs keep taking the free port we picked.
	startAttempts = 5
)

// ErrNoRedisServer is returned by StartCluster when redis-server is not on
// PATH.
var ErrNoRedisServer = errors.New("redistest: redis-server not found on PATH (install it: " + InstallHint + ")")

// Available reports whether redis-server is on PATH. The answer is computed
// once per process.
func Available() bool {
	_, err := lookPath()
	return err == nil
}

// Option configures Start and StartCluster.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	args []string
	logf func(format string, args ...any)
	// clockOffsets shifts the wall clock of some servers (WithClockOffset;
	// StartRedisCluster only).
	clockOffsets map[int]time.Duration
}

func buildConfig(defaults config, opts []Option) config {
	c := defaults
	c.args = slices.Clone(c.args)
	c.clockOffsets = maps.Clone(c.clockOffsets)
	for _, o := range opts {
		o.apply(&c)
	}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	return c
}

// WithArgs appends arguments to every redis-server command line, after the
// defaults, which they override: WithArgs("--appendonly", "yes"). The default
// is none. Restart still starts a node empty: it deletes the node's data
// directory first.
func WithArgs(args ...string) Option {
	args = slices.Clone(args)
	return optionFunc(func(c *config) { c.args = append(c.args, args...) })
}

// WithLogf sets where the harness logs: proxy errors, and each server's own
// log when a test fails (under Start) or a server does not start. The
// default is t.Logf under Start, and discarding under StartCluster.
func WithLogf(logf func(format string, args ...any)) Option {
	return optionFunc(func(c *config) { c.logf = logf })
}

// Cluster is a set of redis-server processes, each behind its own Proxy.
// Nodes are numbered from 0 to N()-1.
//
// Methods are safe for concurrent use; fault methods on one node are
// serialized. Under Start, a method that fails calls t.Fatalf, so call it
// from the test's goroutine. Under StartCluster it logs, records the error
// for Err, and returns.
type Cluster struct {
	cfg   config
	dir   string // temporary root: one directory per node
	nodes []*node
	tb    testing.TB // set by Start; nil under StartCluster

	closeOnce sync.Once
	closeErr  error // written once inside closeOnce

	mu      sync.Mutex // protects the fields below
	closed  bool
	clients []*redis.Client // made by Client and Admin; closed by Close
	admins  map[int]*redis.Client
	errs    []error // failures recorded under StartCluster
}

// node is one server and its proxy.
type node struct {
	dir   string // holds redis.log and data/
	proxy *Proxy
	port  atomic.Int64 // the server's port; changes only if Restart must move

	mu     sync.Mutex // protects proc, hold and closed; held across a whole fault operation
	proc   *process   // nil while killed
	hold   io.Closer  // while killed: the port, bound and not listening (reserve); may be nil
	closed bool       // set by Close: nothing may start afterwards
}

// unhold gives up the port reserved by Kill.
func (n *node) unhold() {
	if n.hold != nil {
		n.hold.Close()
		n.hold = nil
	}
}

func (n *node) dataDir() string { return filepath.Join(n.dir, "data") }
func (n *node) logPath() string { return filepath.Join(n.dir, "redis.log") }
func (n *node) serverAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.FormatInt(n.port.Load(), 10))
}

// Start starts n redis-server processes on free ports of 127.0.0.1, each
// behind a Proxy, and waits until all of them answer. A t.Cleanup stops
// everything, also when the test fails; on failure it first logs every
// server's log.
//
// If redis-server is not on PATH, Start skips the test, or fails it when the
// environment variable CI is not empty, so that CI cannot go green without
// running these tests.
func Start(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if !Available() {
		msg := "redistest: redis-server not found on PATH; install it with: " + InstallHint
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (failing, not skipping, because CI is set)")
		}
		t.Skip(msg)
	}
	c, err := newCluster(n, buildConfig(config{logf: t.Logf}, opts))
	if err != nil {
		t.Fatalf("redistest.Start(%d): %v", n, err)
	}
	c.tb = t
	t.Cleanup(func() {
		if t.Failed() {
			c.logServerLogs()
		}
		if err := c.Close(); err != nil {
			t.Errorf("redistest: Close: %v", err)
		}
	})
	return c
}

// StartCluster is Start for code without a testing.TB, such as benchmark
// commands. The caller must call Close. It returns ErrNoRedisServer if
// redis-server is not on PATH.
func StartCluster(n int, opts ...Option) (*Cluster, error) {
	if !Available() {
		return nil, ErrNoRedisServer
	}
	return newCluster(n, buildConfig(config{}, opts))
}

func newCluster(n int, cfg config) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("redistest: need at least 1 node, got %d", n)
	}
	if len(cfg.clockOffsets) > 0 {
		return nil, errors.New("redistest: WithClockOffset applies to StartRedisCluster only")
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, dir: dir, admins: make(map[int]*redis.Client)}
	for i := range n {
		nd := &node{dir: filepath.Join(dir, "node"+strconv.Itoa(i))}
		if err := resetDir(nd.dataDir()); err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, nd)
	}

	// Start the servers in parallel: each takes tens of milliseconds, and
	// clusters are started in many tests.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, nd := range c.nodes {
		wg.Go(func() {
			nd.mu.Lock()
			defer nd.mu.Unlock()
			errs[i] = c.startLocked(nd, 0)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}

	for i, nd := range c.nodes {
		p, err := newProxy(nd.serverAddr(), cfg.logf)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("redistest: node %d: %w", i, err)
		}
		nd.proxy = p
	}
	return c, nil
}

// startLocked starts nd's server on port, or on a free port if port is 0 or
// taken. nd.mu must be held.
func (c *Cluster) startLocked(nd *node, port int) error {
	if nd.closed {
		return errors.New("redistest: cluster is closed")
	}
	for attempt := 1; ; attempt++ {
		if port == 0 {
			var err error
			if port, err = freePort(); err != nil {
				return err
			}
		}
		p, err := spawn(port, nd.dataDir(), nd.logPath(), c.cfg.args)
		if err == nil {
			nd.proc = p
			nd.port.Store(int64(port))
			return nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return err
		}
		c.cfg.logf("redistest: port %d was taken; trying another", port)
		port = 0
	}
}

// Close closes the clients made by Client, Clients and Admin, stops the
// proxies, kills every server (resuming paused ones, so none is left
// stopped), reaps them, and removes the temporary directory. It waits for
// every goroutine the Cluster started. Calling Close again returns the first
// call's result.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Cluster) close() error {
	c.mu.Lock()
	c.closed = true
	clients := c.clients
	c.clients = nil
	c.mu.Unlock()

	var errs []error
	for _, cl := range clients {
		// A test may have closed its client already; that is not an error.
		if err := cl.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Go(func() {
			if nd.proxy != nil {
				nd.proxy.Close()
			}
			nd.mu.Lock()
			defer nd.mu.Unlock()
			nd.closed = true
			nd.unhold()
			if nd.proc != nil {
				nd.proc.kill()
				nd.proc = nil
			}
		})
	}
	wg.Wait()
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Err returns the failures recorded by methods of a Cluster made by
// StartCluster, joined, or nil. Under Start, failures go to t.Fatalf instead.
func (c *Cluster) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.errs...)
}

// N returns the number of nodes.
func (c *Cluster) N() int { return len(c.nodes) }

// Addr returns the address of node i's proxy, which is what lock clients
// should connect to, so that Cut and SetLatency apply to them.
func (c *Cluster) Addr(i int) string {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return ""
	}
	return nd.proxy.Addr()
}

// ServerAddr returns node i's own address, bypassing the proxy. It changes
// only if Restart found the old port taken by another program.
func (c *Cluster) ServerAddr(i int) string {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return ""
	}
	return nd.serverAddr()
}

// Client returns a new client for node i, through its proxy. It fails fast so
// that faults are visible: ContextTimeoutEnabled (a ctx deadline bounds the
// dial and the command), DialTimeout ClientDialTimeout, one dial attempt,
// and no retries (MaxRetries -1). Close closes it.
func (c *Cluster) Client(i int) *redis.Client {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return nil
	}
	cl := redis.NewClient(clientOptions(nd.proxy.Addr()))
	c.track(cl)
	return cl
}

// Clients returns one new Client per node, in node order, as the
// redis.UniversalClient values a lock client takes.
func (c *Cluster) Clients() []redis.UniversalClient {
	c.helper()
	out := make([]redis.UniversalClient, len(c.nodes))
	for i := range c.nodes {
		out[i] = c.Client(i)
	}
	return out
}

// Admin returns a client connected to node i's server directly, bypassing the
// proxy, for inspecting keys. It is made once per node and closed by Close;
// do not close it. It follows the server if Restart moves it to another port.
func (c *Cluster) Admin(i int) *redis.Client {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.admins[i]; ok {
		return cl
	}
	opts := clientOptions(nd.serverAddr())
	// Dial the current address, not the one in opts: Restart may move the
	// server to a new port.
	opts.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, nd.serverAddr())
	}
	cl := redis.NewClient(opts)
	if c.closed {
		cl.Close()
	} else {
		c.clients = append(c.clients, cl)
	}
	c.admins[i] = cl
	return cl
}

// Kill sends SIGKILL to node i's server and waits until it has exited. Its
// proxy stays up and resets every connection, so commands to Addr(i) fail
// until Restart; dials to ServerAddr(i) are refused, and its port stays
// reserved (bound, not listening), so that no other server takes it
// meanwhile — when the kernel lets it be bound: a connection of the dead
// server that lingers on the port (after a direct client's connection)
// prevents that, and Kill logs it. Killing a node that is down does
// nothing.
func (c *Cluster) Kill(i int) {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	// Down before the kill, so that no new connection reaches the dying
	// server, nor a stranger that binds its port afterwards.
	nd.proxy.setDown(true)
	if nd.proc != nil {
		nd.proc.kill()
		nd.proc = nil
		// Its direct address stays refused, and no other server takes it,
		// unless the kernel keeps a connection of the dead server on the
		// port (TIME_WAIT or FIN_WAIT2 after a direct client's connection)
		// and refuses the bind.
		var err error
		if nd.hold, err = reserveWithin(int(nd.port.Load()), reserveWait); err != nil {
			port := int(nd.port.Load())
			c.cfg.logf("redistest: Kill(%d): port %d could not be reserved within %v (%v: a connection of the dead server lingers on it, or another process holds it; sockets on it: [%s]); another server may take it", i, port, reserveWait, err, tcpStates(port))
		}
	}
}

// Pause sends SIGSTOP to node i's server and waits until it has stopped.
// Connections stay open and commands hang: the kernel still accepts and
// buffers them. Resume, Kill, Restart and Close all end a pause.
func (c *Cluster) Pause(i int) {
	c.helper()
	c.signal(i, "Pause", (*process).pause)
}

// Resume sends SIGCONT to node i's server. Resuming a node that is not
// paused does nothing.
func (c *Cluster) Resume(i int) {
	c.helper()
	c.signal(i, "Resume", (*process).resume)
}

// signal applies send to node i's running server; op names the call in
// failures.
func (c *Cluster) signal(i int, op string, send func(*process) error) {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil {
		c.failf("redistest: %s(%d): node is killed", op, i)
		return
	}
	if err := send(nd.proc); err != nil {
		c.failf("redistest: %s(%d): %v", op, i, err)
	}
}

// Restart kills node i's server if it is running, then starts it again,
// empty, on the same port, and waits until it answers. It deletes the node's
// data directory first, so the server starts empty even if WithArgs turned
// persistence on: this models a node that loses its keys, the case the
// Redlock analysis worries about. If another program took the port
// meanwhile, the server moves to a new one and the proxy follows; Addr(i)
// does not change.
func (c *Cluster) Restart(i int) {
	c.helper()
	nd := c.node(i)
	if nd == nil {
		return
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	nd.proxy.setDown(true)
	if nd.proc != nil {
		nd.proc.kill()
		nd.proc = nil
	}
	if err := resetDir(nd.dataDir()); err != nil {
		c.failf("redistest: Restart(%d): %v", i, err)
		return
	}
	nd.unhold()
	if err := c.startLocked(nd, int(nd.port.Load())); err != nil {
		c.failf("redistest: Restart(%d): %v", i, err)
		return
	}
	nd.proxy.setTarget(nd.serverAddr())
	nd.proxy.setDown(false)
}

// SetLatency delays each direction of node i's proxy by d, for existing and
// new connections: a round trip takes at least 2*d longer. 0 removes it.
func (c *Cluster) SetLatency(i int, d time.Duration) {
	c.helper()
	if nd := c.node(i); nd != nil {
		nd.proxy.SetLatency(d)
	}
}

// Cut makes node i's proxy reset every connection, current and new, until
// Heal: a network partition between the clients and node i.
func (c *Cluster) Cut(i int) {
	c.helper()
	if nd := c.node(i); nd != nil {
		nd.proxy.Cut()
	}
}

// Heal ends a Cut of node i.
func (c *Cluster) Heal(i int) {
	c.helper()
	if nd := c.node(i); nd != nil {
		nd.proxy.Heal()
	}
}

// pids returns the PIDs of the running servers, for tests.
func (c *Cluster) pids() []int {
	var pids []int
	for _, nd := range c.nodes {
		nd.mu.Lock()
		if nd.proc != nil {
			pids = append(pids, nd.proc.cmd.Process.Pid)
		}
		nd.mu.Unlock()
	}
	return pids
}

func (c *Cluster) node(i int) *node {
	c.helper()
	if i < 0 || i >= len(c.nodes) {
		c.failf("redistest: node %d out of range [0, %d)", i, len(c.nodes))
		return nil
	}
	return c.nodes[i]
}

func (c *Cluster) track(cl *redis.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		// Hand out a closed client rather than nil: its commands fail with
		// redis.ErrClosed instead of panicking.
		cl.Close()
		return
	}
	c.clients = append(c.clients, cl)
}

// helper marks the caller as a test helper, so that failures point at the
// test line that called the Cluster method.
func (c *Cluster) helper() {
	if c.tb != nil {
		c.tb.Helper()
	}
}

func (c *Cluster) failf(format string, args ...any) {
	if c.tb != nil {
		c.tb.Helper()
		c.tb.Fatalf(format, args...)
		return
	}
	err := fmt.Errorf(format, args...)
	c.cfg.logf("%v", err)
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

// logServerLogs logs each server's log, which only says anything when
// something went wrong: servers run with --loglevel warning.
func (c *Cluster) logServerLogs() {
	for i, nd := range c.nodes {
		if b, err := os.ReadFile(nd.logPath()); err == nil && len(b) > 0 {
			c.cfg.logf("redistest: node %d (%s) log:\n%s", i, nd.serverAddr(), b)
		}
	}
}

func clientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		DialTimeout:           ClientDialTimeout,
		DialerRetries:         1, // 0 means the default, 5
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		// Keep the handshake to HELLO alone: under SetLatency every extra
		// round trip on connect costs 2*d. CLIENT SETINFO and CLIENT
		// MAINT_NOTIFICATIONS would fail on Redis 7.0 anyway.
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}
