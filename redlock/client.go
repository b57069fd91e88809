package redlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/renew"
)

const (
	// closeGrace is added to the node timeout when Close waits for requests
	// still in flight.
	closeGrace = 250 * time.Millisecond
)

// clientNode is one Redis master: a Node of the Client's node.Set (its
// client, health, in-flight cap, identity check and clock).
type clientNode struct {
	*node.Node
}

// fenceSuffix names a resource's fence counter: key + fenceSuffix.
const fenceSuffix = ":fence"

// lockKey names resource's lock key on this node. On a Cluster node it
// carries a hash tag, so that the lock's other keys (its name and a
// suffix: the fence counter, the queue, the guards) live in its slot and
// one script may touch them all.
func (n *clientNode) lockKey(prefix, resource string) string {
	if n.Cluster {
		return prefix + "{" + resource + "}"
	}
	return prefix + resource
}

// lockKeys names the keys of a lock of cfg's kind (Mode: rwlock.go,
// multilock.go) on this node, held by token (newLock).
func (n *clientNode) lockKeys(prefix, resource string, cfg config, token string) scripts.Keys {
	if cfg.mode == ModeMulti {
		locks := make([]string, len(cfg.resources))
		for i, r := range cfg.resources {
			locks[i] = n.lockKey(prefix, r)
		}
		return scripts.NewMultiKeys(locks, token)
	}
	lock, fence := n.lockKey(prefix, resource), ""
	if cfg.fencing {
		fence = lock + fenceSuffix
	}
	switch cfg.mode {
	case ModeRead: // readers have no fence
		if testhooks.ReaderIgnoresWriter.Load() { // a negative control of the chaos checker
			return scripts.NewBrokenReadKeys(lock, token)
		}
		return scripts.NewReadKeys(lock, token)
	case ModeWrite:
		return scripts.NewWriteKeys(lock, fence, token)
	}
	return scripts.NewKeys(lock, fence, token)
}

// Client acquires locks on a majority of N independent Redis masters. It is
// safe for concurrent use. Close it when done: it stops the renewals and
// releases every lock still held.
type Client struct {
	// access is how package election and the qlock command reach the node
	// layer (node.LinkOf; election_access.go), embedded under an unexported
	// name so that the Client exports nothing for it.
	access
	nodes  []clientNode
	set    *node.Set // the node layer: identity checks, clocks, Call
	cfg    config    // defaults for every lock
	quorum int
	sched  *renew.Scheduler
	wake   *wakeups
	// anyCluster is set when a node is a Cluster client: resources may then
	// not contain braces, which would change the hash tag.
	anyCluster bool
	// wg owns every goroutine an operation leaves behind: stragglers after an
	// early decision, background releases. Its goroutines are reused from
	// one request to the next (see quorum.Workers).
	wg      quorum.Workers
	closing chan struct{} // closed by Close
	rel     *releaser     // the per-node release-retry loops (releaser.go)
	ids     atomic.Uint64 // call and lock IDs for hooks
	id      string        // names this Client in queue entries and its wake-up channel
	chanPre string        // write-once in New: see channelPrefix
	// wakeArgs is the scripts' wake-up argument (scripts.WakeArg, made in New).
	wakeArgs string

	lineMu  sync.Mutex         // protects cohorts
	cohorts map[string]*cohort // per resource: this Client's Lock calls in line (cohort.go)

	mu      sync.Mutex // protects closed, locks, maxWait
	closed  bool
	locks   map[*Lock]struct{}
	held    map[string]int // per resource: locks in locks, to tell a caller it holds one already
	maxWait time.Duration  // longest node timeout used, for Close's bounded wait
	owned   []io.Closer    // node clients this Client built (none with New)

	// cbs owns the goroutines that run Lost hooks and OnLost (callbacks.go).
	cbs       callbacks
	closeDone chan struct{} // closed when the first Close has finished
	closeErr  error         // what the first Close returned; write-once before closeDone
}

// New returns a Client over nodes, which must be independent Redis masters
// (a *redis.Client, a failover client, or a *redis.ClusterClient each; not a
// *redis.Ring, which moves keys between shards). Options set the defaults of
// every lock. New does no I/O. Build node clients with
// ContextTimeoutEnabled: true, so that a node timeout also frees the
// connection, and DialerRetries: 1, so that a node that refuses
// connections is known at once (with go-redis's default of 5 dials 100ms
// apart per try, it looks silent until the node timeout, and Close waits
// that long for it). Close does not close the node clients.
//
// A lock needs a majority of the nodes, len(nodes)/2+1. One or two nodes
// are accepted, without a warning, but tolerate no failure: one node is
// needed by every lock, and so are both of two. Use an odd number, 3 or
// more.
//
// New returns an error matching ErrInvalidArgument on bad input, including
// the same client twice, two clients with one address (one server counted
// twice is no quorum), or a client whose MaxRetries (Cluster: MaxRedirects)
// is below -1. Two names of one server (127.0.0.1 and localhost, say) are
// found on first use instead, since New does no I/O: before its first
// request to a node the Client checks that the node is none of the others
// (a key of its own, written and looked for with one script), and once two
// are found to reach one server every Lock, TryLock, IsLocked and Extend
// fails with ErrInvalidArgument naming both (see docs/nodes.md).
//
// New adds a go-redis DialHook to each node client (once per client,
// whichever Clients share it), so that a node whose dials fail is reported
// with the dialer's error and answered at once while it is down.
func New(nodes []redis.UniversalClient, opts ...Option) (*Client, error) {
	if len(nodes) == 0 {
		return nil, invalid("nodes: at least one node is needed")
	}
	cfg, err := buildConfig(defaultConfig(), opts, false)
	if err != nil {
		return nil, err
	}
	c := &Client{
		nodes:   make([]clientNode, len(nodes)),
		cfg:     cfg,
		quorum:  quorum.Size(len(nodes)),
		closing: make(chan struct{}),
		locks:   make(map[*Lock]struct{}),
		held:    make(map[string]int),
		cohorts: make(map[string]*cohort),
		maxWait: cfg.nodeTimeout,
	}
	c.closeDone = make(chan struct{})
	for i, n := range nodes {
		if isNil(n) {
			return nil, invalid("nodes[%d] is nil", i)
		}
		if _, ok := n.(*redis.Ring); ok {
			return nil, invalid("nodes[%d] is a *redis.Ring: it moves keys between shards, so it is not one independent master", i)
		}
		if err := checkNode(nodes, i); err != nil {
			return nil, err
		}
	}
	c.chanPre = c.cfg.keyPrefix + "wake:"
	// Renewals due within a short window go out together: a twentieth of
	// the default interval, at most 20ms early.
	c.sched = renew.NewBatched(batcher{c}, renew.Batching{Max: cfg.renewBatch, Window: min(cfg.renewInterval/20, 20*time.Millisecond)})
	id, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("redlock: client ID: %w", err)
	}
	c.id = id.String()
	c.set = node.NewSet(nodes, node.Config{Timeout: cfg.nodeTimeout, Drift: cfg.drift, KeyPrefix: cfg.keyPrefix, ID: c.id,
		Go: c.spawn, Closing: c.closing, Invalid: invalid})
	c.access = node.NewAccess(c.set, c.lockTimeout, c.goOwned)
	for i := range c.set.Nodes {
		c.nodes[i] = clientNode{&c.set.Nodes[i]}
		c.anyCluster = c.anyCluster || c.nodes[i].Cluster
	}
	c.wake = newWakeups(c, c.channelPrefix()+c.id)
	c.rel = newReleaser(c)
	// With any Redis Cluster node, no node counts who listens, as a Cluster
	// node cannot (a Client's channel lives on another shard than the
	// key), and the arguments of a lock are the same on every node.
	c.wakeArgs = scripts.WakeArg(c.channelPrefix(), !c.anyCluster)
	return c, nil
}

// checkNode returns an error matching ErrInvalidArgument, naming nodes by
// index, if nodes[i] cannot be one of nodes: it is the same client as an
// earlier one or reaches the same address (see nodecheck.DuplicateNode), or go-redis
// would drop commands sent through it (see nodecheck.DroppedCommands). Every node up
// to i must be non-nil. It does no I/O.
func checkNode(nodes []redis.UniversalClient, i int) error {
	if j, why := nodecheck.DuplicateNode(nodes, i); j >= 0 {
		return invalid("nodes[%d] and nodes[%d] %s: one server counted twice is not a majority", j, i, why)
	}
	if why := nodecheck.DroppedCommands(nodes[i]); why != "" {
		return invalid("nodes[%d]: %s", i, why)
	}
	return nil
}

func isNil(n redis.UniversalClient) bool {
	if n == nil {
		return true
	}
	v := reflect.ValueOf(n)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// begin registers an operation, so that Close waits for it; it fails once
// the Client is closed. c.wg.Done must follow.
func (c *Client) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.wg.Add(1)
	return nil
}

// beginCall is begin for a lock call whose node timeout is d, which Close
// then waits for its stragglers at least (noteTimeout), in one step.
func (c *Client) beginCall(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.maxWait = max(c.maxWait, d)
	c.wg.Add(1)
	return nil
}

// channelPrefix is the prefix of the Clients' wake-up channels: a
// release tells the first waiter's Client on prefix + its ID.
// It is built once: every release sends it.
func (c *Client) channelPrefix() string { return c.chanPre }

// holds reports whether this Client holds a lock on resource.
func (c *Client) holds(resource string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[resource] > 0
}

func (c *Client) noteTimeout(d time.Duration) {
	c.mu.Lock()
	c.maxWait = max(c.maxWait, d)
	c.mu.Unlock()
}

// joinNodeErrors joins head with one *NodeError per failed node of t.
func (c *Client) joinNodeErrors(head error, t quorum.Tally) error {
	errs := []error{head}
	for i, e := range t.Errs {
		if e == nil {
			continue
		}
		if ne := (*NodeError)(nil); !errors.As(e, &ne) {
			e = &NodeError{Node: i, Addr: c.nodes[i].Addr, Err: c.nodes[i].Health.Cause(e)}
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 {
		return head
	}
	return errors.Join(errs...)
}

// IsLocked reports whether a majority of nodes hold a key for resource,
// whoever owns it. It returns an error matching ErrNoQuorum when too few
// nodes answered to tell, and ctx's error alone (nothing sent) when ctx
// was done before the call.
func (c *Client) IsLocked(ctx context.Context, resource string) (bool, error) {
	if err := c.checkResource(resource); err != nil {
		return false, err
	}
	if err := c.begin(); err != nil {
		return false, err
	}
	defer c.wg.Done()
	if ctx.Err() != nil {
		return false, ctxDoneBefore(ctx) // nothing sent (issue 44 item 3)
	}
	n := len(c.nodes)
	r := quorum.Start(ctx, n, c.cfg.nodeTimeout, &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, site{c.cfg.obs, "exists", resource}, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, err := scripts.Exists(ctx, s, c.nodes[i].lockKey(c.cfg.keyPrefix, resource))
			return reply{ours: ok}, err
		})
	})
	t := r.Collect(ctx, classify, func(t quorum.Tally) bool {
		return t.Yes >= c.quorum || t.No > n-c.quorum || t.Pending == 0
	})
	switch {
	case t.Yes >= c.quorum:
		return true, nil
	case t.No > n-c.quorum:
		return false, nil
	case c.set.Duplicate() != nil:
		return false, c.set.Duplicate()
	case cancelled(t):
		return false, c.joinNodeErrors(ctxCancelled(fmt.Sprintf("0 of %d nodes answered", n)), t)
	}
	return false, c.joinNodeErrors(fmt.Errorf("%w: %d of %d nodes answered, %d needed", ErrNoQuorum, t.Yes+t.No, n, c.quorum), t)
}

// goCallback runs fn on a goroutine the Client owns, unless the Client is
// closed.
func (c *Client) goCallback(fn func()) { _ = c.spawn(fn) }

// spawn runs fn on a goroutine the Client owns, or returns ErrClosed once
// Close has begun.
func (c *Client) spawn(fn func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.wg.Go(fn)
	return nil
}
