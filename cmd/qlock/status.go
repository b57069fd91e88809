package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/redlock"
)

// statusTimeout bounds each node's reads.
const statusTimeout = 2 * time.Second

// nodeStatus is what one node says about a resource.
type nodeStatus struct {
	addr    string
	err     error
	held    bool   // the lock key holds a token
	holder  string // identity from the identity key, if any
	pttl    time.Duration
	fence   string
	waiting int64 // Lock calls queued on this node
	readers int64 // live read locks (qlock run -read, RLock): the key then holds the readers' marker
	// readerIDs are the live readers' members on this node (never printed:
	// a member holds its reader's token), to count who holds on a majority.
	readerIDs []string
	rwWait    int64 // RLock/WLock calls waiting on this node
}

// cmdStatus is qlock status: per node raw reads (never printing tokens),
// and the verdict.
func cmdStatus(args []string, stdout, stderr io.Writer) int {
	var c common
	fs := c.flags("status", stderr, false)
	resource, rest, err := c.parse(fs, "RESOURCE", args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return fail(stderr, exitUsage, fmt.Errorf("status: %w (see qlock help)", err))
	case len(rest) > 0:
		return fail(stderr, exitUsage, fmt.Errorf("status: unexpected arguments after RESOURCE: %q", rest))
	}
	tlsOpts, err := c.tlsOptions()
	if err != nil {
		return fail(stderr, exitUsage, fmt.Errorf("status: %w", err))
	}
	nodes, err := redlock.NodeClients(c.urls(), tlsOpts...)
	if err != nil {
		return fail(stderr, exitUsage, fmt.Errorf("status: %w", err))
	}
	defer closeNodes(nodes)
	if c.permits > 0 {
		return statusPermits(nodes, &c, resource, stdout) // permit.go
	}

	sts := make([]nodeStatus, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { sts[i] = readNode(n, c.prefix, resource) })
	}
	wg.Wait()

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tSTATE\tHOLDER\tPTTL\tFENCE\tWAITING\tREADERS")
	held, free, failed := 0, 0, 0
	for i, st := range sts {
		if st.err != nil {
			failed++
			fmt.Fprintf(tw, "%d\t%s\terror: %s\t-\t-\t-\t-\t-\n", i, st.addr, oneLine(st.err))
			continue
		}
		state, pttl, holder := "free", "-", "-"
		switch {
		case st.held && st.readers > 0:
			held++
			state = "read"
			pttl = st.pttl.Round(time.Millisecond).String()
		case st.held:
			held++
			state = "held"
			pttl = st.pttl.Round(time.Millisecond).String()
			if st.holder != "" {
				holder = st.holder
			}
		default:
			free++
		}
		if st.pttl < 0 && st.held {
			pttl = "no TTL"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", i, st.addr, state, holder, pttl, st.fence, st.waiting+st.rwWait, st.readers)
	}
	tw.Flush()

	n := len(nodes)
	q := n/2 + 1
	switch {
	case held >= q:
		fmt.Fprintf(stdout, "verdict: held by a majority (%d of %d nodes, %d needed)\n", held, n, q)
		if r := majorityReaders(sts, q); r > 0 {
			fmt.Fprintf(stdout, "readers: at least %d (read locks; a writer waits for them)\n", r)
		}
		if h := majorityHolder(sts, q); h != "" {
			fmt.Fprintf(stdout, "holder: %s\n", h)
		}
		return 0
	case free > n-q:
		if held > 0 {
			fmt.Fprintf(stdout, "verdict: free (held on %d of %d nodes: a minority, which no client counts)\n", held, n)
		} else {
			fmt.Fprintf(stdout, "verdict: free (%d of %d nodes)\n", free, n)
		}
		return exitFree
	}
	fmt.Fprintf(stdout, "verdict: unknown: %d of %d nodes answered, %d needed\n", n-failed, n, q)
	return exitNoQuorum
}

// readNode reads resource's keys on one node: the lock key and its PTTL,
// the fence counter, the identity key, and the waiter queue. The token
// itself is never kept. The key names are redlock's: lock key prefix +
// resource (a hash tag on Cluster nodes), its fence counter at lock key +
// ":fence", its waiter queue at lock key + ":queue".
func readNode(n redis.UniversalClient, prefix, resource string) nodeStatus {
	st := nodeStatus{addr: nodeaddr.Of(n), fence: "-"}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	lock := prefix + resource
	if _, ok := n.(*redis.ClusterClient); ok {
		lock = prefix + "{" + resource + "}"
	}
	_, err := n.Get(ctx, lock).Result()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		st.err = err
		return st
	default:
		st.held = true
	}
	if st.held {
		if st.pttl, err = n.PTTL(ctx, lock).Result(); err != nil {
			st.err = err
			return st
		}
		if id, err := n.Get(ctx, lock+election.LeaderSuffix).Result(); err == nil {
			var l election.Leader
			if json.Unmarshal([]byte(id), &l) == nil {
				st.holder = l.Identity
			}
		}
	}
	if f, err := n.Get(ctx, lock+":fence").Result(); err == nil {
		st.fence = f
	}
	st.waiting, _ = n.ZCard(ctx, lock+":queue").Result()
	// Read-write locks (docs/rwlock.md): live readers beside the key (a
	// sorted set scored by expiry on the node's clock), and the RLock and
	// WLock calls waiting.
	if st.held {
		if now, err := n.Time(ctx).Result(); err == nil {
			st.readerIDs, _ = n.ZRangeByScore(ctx, lock+scripts.ReadersSuffix, &redis.ZRangeBy{Min: fmt.Sprint(now.UnixMilli()), Max: "+inf"}).Result()
			st.readers = int64(len(st.readerIDs))
		}
	}
	st.rwWait, _ = n.ZCard(ctx, lock+scripts.RWWaitSuffix).Result()
	return st
}

// majorityReaders returns how many readers hold on a majority of nodes:
// each reader holds on a majority, not necessarily the same one (a
// reader's request to the last node may land late, or not at all), so it
// counts each reader's member across the nodes that answered. It is exact
// when every node answered, and a lower bound otherwise.
func majorityReaders(sts []nodeStatus, q int) int64 {
	on := make(map[string]int)
	for _, st := range sts {
		if st.err == nil {
			for _, id := range st.readerIDs {
				on[id]++
			}
		}
	}
	var n int64
	for _, c := range on {
		if c >= q {
			n++
		}
	}
	return n
}

// majorityHolder returns the identity a majority of nodes name, if any.
func majorityHolder(sts []nodeStatus, q int) string {
	count := map[string]int{}
	for _, st := range sts {
		if st.err == nil && st.held && st.holder != "" {
			count[st.holder]++
		}
	}
	for h, c := range count {
		if c >= q {
			return h
		}
	}
	return ""
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
