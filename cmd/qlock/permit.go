package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/holder"
	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

// maxPermits bounds -n: qlock status reads every permit on every node.
const maxPermits = redlock.MaxPermits

// runPermit is qlock run -n K: the command runs under one of K permits of
// the semaphore RESOURCE (redlock.Semaphore, as consul lock -n), renewed,
// stopped on loss and released as under a lock. The permit's identity is
// written beside its key, as an election writes a leader's, for qlock
// status -n.
func runPermit(c *common, resource string, command []string, sigs <-chan os.Signal, stderr io.Writer) int {
	dctx, dcancel := context.WithTimeout(context.Background(), dialTimeout)
	client, nodes, err := c.connect(dctx, stderr)
	dcancel()
	if err != nil {
		return fail(stderr, exitFor(err), fmt.Errorf("connecting: %w", err))
	}
	defer closeNodes(nodes)
	defer client.Close()
	sem, err := client.Semaphore(resource, c.permits, redlock.WithTTL(c.ttl), redlock.WithFencing(c.fencing))
	if err != nil {
		return fail(stderr, exitUsage, err)
	}

	l, stopped := waitUnlessSignalled(sigs, stderr, resource, "a permit",
		func(ctx context.Context) *redlock.Lock {
			if c.wait.d == 0 {
				var l *redlock.Lock
				l, err = sem.TryAcquire(ctx) // like flock -n
				return l
			}
			if c.wait.d > 0 { // < 0: -wait forever
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.wait.d)
				defer cancel()
			}
			var l *redlock.Lock
			l, err = sem.Acquire(ctx)
			return l
		}, unlockIfHeld)
	if stopped != 0 {
		return stopped
	}
	if err != nil {
		return fail(stderr, exitFor(err), fmt.Errorf("%s: %w", resource, err))
	}
	// The command inherits qlock's environment: QLOCK_PERMIT and
	// QLOCK_PERMITS join the variables runChild sets.
	os.Setenv("QLOCK_PERMIT", strconv.Itoa(sem.Permit(l)))
	os.Setenv("QLOCK_PERMITS", strconv.Itoa(c.permits))
	id := startIdentity(client, c, l)
	res := runChild(permitLease{l, c.identity}, resource, command, c, sigs, stderr)
	id.stop()
	rctx, rcancel := context.WithTimeout(context.Background(), dialTimeout)
	defer rcancel()
	if err := l.Unlock(rctx); err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		fail(stderr, 0, fmt.Errorf("%s: release: %w", resource, err))
	}
	return res.code
}

// permitLease is a permit as a lease, with this process's identity.
type permitLease struct {
	*redlock.Lock
	identity string
}

func (p permitLease) Leader() election.Leader { return election.Leader{Identity: p.identity} }

// identity keeps the permit holder's identity on the nodes while the
// command runs: written at once and every TTL/3, as an election writes a
// leader's (scripts.Proclaim: only while the permit key holds the permit's
// token, with its remaining TTL), so that status can name the holder and a
// crashed holder's name goes with its permit.
type identity struct {
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
	write    func()
	withdraw func()
}

func startIdentity(client *redlock.Client, c *common, l *redlock.Lock) *identity {
	var term [12]byte
	_, _ = rand.Read(term[:])
	// The term makes the value unique to this holding, for scripts.Withdraw.
	me := election.Leader{Identity: c.identity, Term: hex.EncodeToString(term[:]), Fence: l.Fence(), Since: time.Now()}
	val, _ := json.Marshal(me)
	link := linkOf(client)
	nodes := clientsOf(link)
	keys := make([]string, len(nodes))
	for i, n := range nodes {
		keys[i] = lockKey(n, c.prefix, l.Resource())
	}
	// Each write carries its node's not-after bound and the withdraw's mark
	// outlasts every write still able to land, sized by the node layer
	// (holder.Nodes); the requests are bounded by statusTimeout.
	hn := holder.New(link, "permit identity", nodes, keys, statusTimeout)
	write := func() { hn.Proclaim(l.Context(), l.Token(), string(val), me.Term) }
	// The withdraw waits for every node (each bounded by statusTimeout):
	// qlock exits after it, and no write of the holding sent afterwards
	// may set the identity anywhere.
	withdraw := func() { hn.Withdraw(context.Background(), string(val), me.Term, quorum.All) }
	id := &identity{quit: make(chan struct{}), done: make(chan struct{}), write: write, withdraw: withdraw}
	write()
	go func() {
		defer close(id.done)
		t := time.NewTicker(c.ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-id.quit:
				return
			case <-l.Context().Done():
				return
			case <-t.C:
				write()
			}
		}
	}()
	return id
}

// stop ends the refresh, waits for a write in progress (until a majority
// took it, each request bounded by statusTimeout), and withdraws the
// identity: deleted where it is ours, and no write of ours still in flight
// — one whose reply was lost, or a straggler the refresh stopped waiting
// for — can set it again when it lands (holder.Nodes.Withdraw).
func (id *identity) stop() {
	id.stopOnce.Do(func() {
		close(id.quit)
		<-id.done
		id.withdraw()
	})
}

// lockKey is redlock's key for resource on node n: a hash tag on Cluster
// nodes.
func lockKey(n redis.UniversalClient, prefix, resource string) string {
	if _, ok := n.(*redis.ClusterClient); ok {
		return prefix + "{" + resource + "}"
	}
	return prefix + resource
}

// statusPermits is qlock status -n K: per permit of the semaphore
// resource, on how many nodes it is held, by whom and for how long; the
// waiters in line; and the verdict.
func statusPermits(nodes []redis.UniversalClient, c *common, resource string, stdout io.Writer) int {
	k := c.permits
	n := len(nodes)
	q := n/2 + 1
	sts := make([][]nodeStatus, k+1) // per permit; the last: the waiters' lock
	var wg sync.WaitGroup
	for p := range k + 1 {
		r := resource + ":permit:" + strconv.Itoa(p)
		if p == k {
			r = resource + ":permits"
		}
		sts[p] = make([]nodeStatus, n)
		for i, nd := range nodes {
			wg.Go(func() { sts[p][i] = readNode(nd, c.prefix, r) })
		}
	}
	wg.Wait()
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PERMIT\tSTATE\tNODES\tHOLDER\tPTTL")
	held, free, unknown := 0, 0, 0
	for p := range k {
		h, f := 0, 0
		var pttl time.Duration = -1
		for _, st := range sts[p] {
			switch {
			case st.err != nil:
			case st.held:
				h++
				if pttl < 0 || st.pttl < pttl {
					pttl = st.pttl
				}
			default:
				f++
			}
		}
		state, holder, left := "free", "-", "-"
		switch {
		case h >= q:
			held++
			state = "held"
			if id := majorityHolder(sts[p], q); id != "" {
				holder = id
			}
			left = pttl.Round(time.Millisecond).String()
		case f > n-q:
			free++
		default:
			unknown++
			state = "unknown"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d/%d\t%s\t%s\n", p, state, h, n, holder, left)
	}
	tw.Flush()
	var waiting int64
	for _, st := range sts[k] {
		waiting = max(waiting, st.waiting)
	}
	fmt.Fprintf(stdout, "waiting: %d\n", waiting)
	switch {
	case held == k:
		fmt.Fprintf(stdout, "verdict: all %d permits held\n", k)
		return 0
	case free > 0:
		fmt.Fprintf(stdout, "verdict: %d of %d permits held, %d free\n", held, k, free)
		return exitFree
	}
	fmt.Fprintf(stdout, "verdict: unknown: %d of %d permits held, %d undecided (too few nodes answered)\n", held, k, unknown)
	return exitNoQuorum
}

// linkOf returns client's node layer (node.LinkOf: package redlock exports
// no such plumbing).
func linkOf(client *redlock.Client) node.Linked {
	link, _ := node.LinkOf(client) // a Client of Dial, no options: nothing to refuse
	return link
}

// clientsOf returns the node clients of link, in its Client's order.
func clientsOf(link node.Linked) []redis.UniversalClient {
	nodes := link.Set.Nodes
	out := make([]redis.UniversalClient, len(nodes))
	for i, n := range nodes {
		out[i] = n.C
	}
	return out
}
