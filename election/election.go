package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/holder"
	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

// LeaderSuffix is appended to an election's lock key to name the key that
// holds the leader's identity on each node, and the channel on which
// leadership changes are announced. Election names may not end with it, and
// no lock resource should be named NAME+LeaderSuffix.
const LeaderSuffix = holder.Suffix

// Election is one named leadership, campaigned for on the nodes of a
// redlock.Client: the leader is whoever holds the lock on the resource NAME.
// It is safe for concurrent use; several candidates (Campaign or Run calls)
// may share one Election, though usually each process has one.
type Election struct {
	client *redlock.Client
	nodes  []redis.UniversalClient
	// hn is the election's lock key on the Client's nodes
	// (holder.New): every request of the election goes through its token
	// in the Client's node layer (node.Run, node.Release), bounded by
	// WithNodeTimeout or by default the lock's node timeout, on goroutines
	// the Client owns.
	hn      *holder.Nodes
	name    string
	cfg     config
	quorum  int
	cluster []bool // per node: a Cluster client (keys carry a hash tag)
	// lockTimeout is the node timeout of the campaigns' lock (the Client's
	// defaults with WithLockOptions): the identity refresh follows the
	// lease's renewals within a fraction of it.
	lockTimeout time.Duration
}

// New returns an election named name over client, whose locks it uses and
// on whose nodes it reads and writes the leader's identity, through the
// client's node layer (its gates for a node that is down or stuck, its
// in-flight cap, its identity check), so that it cannot be given other
// nodes than its locks'. The election's requests share the node clients'
// connection pools with the lock's, which is safe because they time out
// where the lock's would (see WithNodeTimeout). New does no I/O.
//
// New returns an error matching redlock.ErrInvalidArgument when client is
// nil, name is empty or ends with LeaderSuffix, or an option is invalid
// (the options of WithLockOptions included: client.Lock would refuse
// them).
func New(client *redlock.Client, name string, opts ...Option) (*Election, error) {
	link, err := linkOf(client)
	if err != nil {
		return nil, err
	}
	return newElection(client, clientsOf(link.Set.Nodes), name, opts)
}

// NewWithNodes is New with nodes given separately: clients of client's
// nodes, in the same order, for instance clients of their own so that an
// election request that times out (go-redis then closes its connection)
// costs the lock's pools nothing. Each must reach the node client's node
// at the same index (the same address), or NewWithNodes returns an error
// matching redlock.ErrInvalidArgument, as New does for its other errors.
//
// Deprecated: use New, which takes the nodes from the Client and so cannot
// be given others. NewWithNodes is New's signature of before, kept for
// compatibility.
func NewWithNodes(client *redlock.Client, nodes []redis.UniversalClient, name string, opts ...Option) (*Election, error) {
	link, err := linkOf(client)
	if err != nil {
		return nil, err
	}
	own := clientsOf(link.Set.Nodes)
	if len(nodes) != len(own) {
		return nil, invalid("nodes: %d given, the Client has %d: an election must use the Client's nodes", len(nodes), len(own))
	}
	for i, n := range nodes {
		if isNil(n) {
			return nil, invalid("nodes[%d] is nil", i)
		}
		if got, want := nodeaddr.Of(n), nodeaddr.Of(own[i]); got != want {
			return nil, invalid("nodes[%d] reaches %s, the Client's node %d is %s: an election must use the Client's nodes", i, got, i, want)
		}
	}
	return newElection(client, nodes, name, opts)
}

// clientsOf returns the node clients of nodes.
func clientsOf(nodes []node.Node) []redis.UniversalClient {
	out := make([]redis.UniversalClient, len(nodes))
	for i := range nodes {
		out[i] = nodes[i].C
	}
	return out
}

func isNil(n redis.UniversalClient) bool {
	return n == nil || reflect.ValueOf(n).Kind() == reflect.Pointer && reflect.ValueOf(n).IsNil()
}

func newElection(client *redlock.Client, nodes []redis.UniversalClient, name string, opts []Option) (*Election, error) {
	cfg := buildConfig(opts)
	switch {
	case len(nodes) == 0:
		return nil, invalid("nodes: at least one node is needed")
	case name == "":
		return nil, invalid("name must not be empty")
	case strings.HasSuffix(name, LeaderSuffix):
		return nil, invalid("name %q: the suffix %q is reserved for identity keys", name, LeaderSuffix)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	link, err := node.LinkOf(client, cfg.lockOpts...)
	if err != nil {
		return nil, fmt.Errorf("election: WithLockOptions: %w", err)
	}
	e := &Election{client: client, nodes: nodes, name: name, cfg: cfg, quorum: len(nodes)/2 + 1,
		lockTimeout: link.LockTimeout()}
	for i, n := range nodes {
		if isNil(n) {
			return nil, invalid("nodes[%d] is nil", i)
		}
		_, c := n.(*redis.ClusterClient)
		e.cluster = append(e.cluster, c)
	}
	keys := make([]string, len(nodes))
	for i := range keys {
		keys[i] = e.lockKey(i)
	}
	// The election's requests go through the Client's node layer: its
	// nodes when they are the Client's clients (New), nodes of their own
	// over the clients given otherwise (NewWithNodes), with the Client's
	// identity check, probes and clocks either way.
	var timeout time.Duration // the lock's
	if cfg.nodeTimeoutSet {
		timeout = cfg.nodeTimeout
	}
	e.hn = holder.New(link, "election", nodes, keys, timeout)
	return e, nil
}

// Name returns the election's name: the resource of its lock.
func (e *Election) Name() string { return e.name }

// Identity returns the identity this Election's candidates proclaim.
func (e *Election) Identity() string { return e.cfg.identity }

// lockKey is the election's lock key on node i, as redlock names it: on a
// Cluster node the resource is a hash tag, so the identity key shares its
// slot and one script can read the one and write the other.
func (e *Election) lockKey(i int) string {
	if e.cluster[i] {
		return e.cfg.keyPrefix + "{" + e.name + "}"
	}
	return e.cfg.keyPrefix + e.name
}

// identityKey is the key holding the leader's identity on node i.
func (e *Election) identityKey(i int) string { return e.hn.Key(i) }

// Channel is the Pub/Sub channel on which candidates announce that they took
// office or left it, and to which Observe subscribes. It is the election's
// own: the lock's wake-ups go to each redlock Client's channel.
func (e *Election) Channel() string { return e.cfg.keyPrefix + e.name + LeaderSuffix }

// proclaim writes value, the identity of term, as the leader's identity on
// every node where the lock key holds token and term was not withdrawn,
// and returns, as soon as a majority took it or can no longer take it, how
// many nodes took it and the node errors. The writes it stops waiting for
// run on, and may land at any time after: the marker withdraw leaves makes
// them write nothing once the term was withdrawn from that node.
func (e *Election) proclaim(ctx context.Context, token, value, term string) (int, []error) {
	t := e.hn.Proclaim(ctx, token, value, term)
	return t.Yes, e.nodeErrors(t)
}

// withdraw ends term on every node (holder.Nodes.Withdraw), once a
// majority answered: no majority read can return value any more.
func (e *Election) withdraw(ctx context.Context, value, term string) {
	if t := e.hn.Withdraw(ctx, value, term, quorum.Majority); !t.Quorum() {
		e.warn(ctx, "identity withdrawn from too few nodes (it expires with the lease)", errors.Join(e.nodeErrors(t)...))
	}
}

// Campaign waits until this candidate is the leader, or ctx is done, and
// returns its Term. It takes the lock on the resource Name with
// client.Lock (so it waits in line and is woken when the leader resigns),
// then writes its identity on the nodes where the lock is held, tied to the
// lease, and announces it. The term lasts until Term.Resign, until the lease
// is lost (Term.Context is then cancelled with cause redlock.ErrLockLost),
// or until the redlock Client is closed; it is never renewed past a loss:
// to lead again after a loss, campaign again.
//
// It returns the errors of redlock.Client.Lock, unchanged: ctx's error
// joined to redlock.ErrNotObtained or ErrNoQuorum when ctx ended while it
// waited, ctx's error alone when ctx was done before the call (nothing is
// sent), redlock.ErrAlreadyHeld when ctx comes from this candidate's own
// term, redlock.ErrClosed, redlock.ErrInvalidArgument; or ErrNoQuorum
// joined with node errors when too few nodes took the identity (the lock
// is then released).
func (e *Election) Campaign(ctx context.Context) (*Term, error) {
	start := time.Now()
	// A term is taken on the nodes, never passed between two Elections of
	// one Client (redlock's local handoff): candidates queue there in their
	// order, and each term's identity is proclaimed by the lock it took.
	opts := append(e.cfg.lockOpts[:len(e.cfg.lockOpts):len(e.cfg.lockOpts)], redlock.WithLocalHandoff(0, 0))
	l, err := e.client.Lock(ctx, e.name, opts...)
	if err != nil {
		return nil, err
	}
	me := Leader{Identity: e.cfg.identity, Term: newTermID(), Fence: l.Fence(), Since: time.Now()}
	b, err := json.Marshal(me)
	if err != nil {
		_ = l.Unlock(context.WithoutCancel(ctx))
		return nil, err
	}
	value := string(b)
	// The identity written now lasts at least until the lease's current
	// validity: the lock key's TTL, which it copies, is longer there.
	written := l.ValidUntil()
	// The lock is ours: finish taking office even if ctx ends now (each
	// write is bounded by the node timeout), rather than give it up.
	ok, errs := e.proclaim(context.WithoutCancel(ctx), l.Token(), value, me.Term)
	if ok < e.quorum {
		e.withdraw(ctx, value, me.Term)
		_ = l.Unlock(context.WithoutCancel(ctx)) // bounded by the lock's node timeout
		return nil, noQuorum(fmt.Sprintf("leader identity written on %d of %d nodes, %d needed", ok, len(e.nodes), e.quorum), errs)
	}
	t := newTerm(e, l, me, value, written)
	e.announce(ctx, "elected")
	e.report(ctx, LeadershipInfo{Election: e.name, Identity: me.Identity, Event: EventAcquired, Fence: me.Fence, Wait: time.Since(start)})
	go t.watch()
	return t, nil
}

// Run campaigns, runs fn while leader, and campaigns again, until ctx is
// done. fn's ctx is cancelled the moment leadership is lost (cause
// redlock.ErrLockLost), Resign is called, or Run's ctx ends; the Term gives
// fn the fence token to attach to its writes.
//
// When fn returns, Run resigns (handing over to a waiting candidate). If the
// term had ended first (lost or resigned) it campaigns again; otherwise fn
// chose to stop, and Run returns fn's error (nil included). A failed
// campaign (too few nodes) is retried after the retry delay.
//
// Run returns ctx's error once ctx is done, fn's error as above, or the
// errors of Campaign that retrying cannot fix: redlock.ErrClosed and
// redlock.ErrInvalidArgument.
func (e *Election) Run(ctx context.Context, fn func(ctx context.Context, t *Term) error) error {
	for {
		t, err := e.Campaign(ctx)
		switch {
		case ctx.Err() != nil:
			if t != nil {
				// Won just as ctx ended: hand the office straight over.
				_ = t.Resign(context.WithoutCancel(ctx))
			}
			return errors.Join(ctx.Err(), err)
		case errors.Is(err, redlock.ErrClosed), errors.Is(err, redlock.ErrInvalidArgument):
			return err
		case err != nil:
			e.warn(ctx, "campaign failed; retrying", err)
			tm := time.NewTimer(e.cfg.retryDelay)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				return ctx.Err()
			}
			continue
		}
		wctx, cancel := context.WithCancelCause(t.Context())
		stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
		ferr := fn(wctx, t)
		stop()
		cancel(nil)
		ended := t.Context().Err() != nil
		rerr := t.Resign(context.WithoutCancel(ctx))
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case ended:
			continue
		case ferr != nil:
			return ferr
		}
		if rerr != nil && !errors.Is(rerr, ErrNotLeader) {
			return rerr
		}
		return nil
	}
}

// linkOf returns the node layer of client, without per-call options
// (node.LinkOf, which only this module's packages can call), or an error
// matching redlock.ErrInvalidArgument when client is nil or was not made
// by redlock.New (or Dial).
func linkOf(client *redlock.Client) (node.Linked, error) {
	if client == nil {
		return node.Linked{}, invalid("client must not be nil")
	}
	link, err := node.LinkOf(client)
	if err != nil { // a zero Client: it has no nodes
		return node.Linked{}, invalid("client was not made by redlock.New or redlock.Dial")
	}
	return link, nil
}
