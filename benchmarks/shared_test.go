package benchmarks

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// TestSharedNodeClients_costPerAcquisition pins what issue 41 looked for:
// 8 redlock Clients contending for one key over one shared set of node
// clients cost the nodes no more per acquisition than 8 Clients with node
// clients of their own (as processes have). Each Client subscribes its own
// wake-up channel once per node, so a release tells one Client: at most
// one PUBLISH per acquisition per node, each to one subscriber, however
// many Clients share the connections. Also logged: acquisitions/s of each.
//
//	QUORUMLOCK_SHARED_SECONDS=3 go test -run TestSharedNodeClients -v .
func TestSharedNodeClients_costPerAcquisition(t *testing.T) {
	secs := envInt(t, "QUORUMLOCK_SHARED_SECONDS", 1)
	const k = 8
	rc := redistest.Start(t, 3)
	shared := nodeClients(t, rc)
	type result struct {
		acq              int
		perNode, publish float64 // calls per acquisition per node
	}
	run := func(name string, own bool) result {
		var cls []*redlock.Client
		for range k {
			ns := shared
			if own {
				ns = nodeClients(t, rc)
			}
			cls = append(cls, newRedlock(t, ns, redlock.WithTTL(8*time.Second)))
		}
		res := "shared:" + name
		before := readStats(t, shared)
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(secs)*time.Second)
		defer cancel()
		var (
			mu   sync.Mutex
			acq  int
			errs []error
			wg   sync.WaitGroup
		)
		for _, c := range cls {
			wg.Go(func() {
				for ctx.Err() == nil {
					l, err := c.Lock(ctx, res)
					if err == nil {
						err = l.Unlock(context.WithoutCancel(ctx))
					}
					mu.Lock()
					if err == nil {
						acq++
					} else if ctx.Err() == nil {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		// The subscriptions: one per Client on every node, each on a
		// channel of its own.
		for i, n := range shared {
			chans, err := n.PubSubChannels(t.Context(), "lock:wake:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			subs, err := n.PubSubNumSub(t.Context(), chans...).Result()
			if err != nil {
				t.Fatal(err)
			}
			for ch, n := range subs {
				if n != 1 {
					t.Errorf("%s: node %d: channel %s has %d subscribers; want 1 (one per Client)", name, i, ch, n)
				}
			}
			if len(chans) < k {
				t.Errorf("%s: node %d: %d wake-up channels; want one per Client, %d", name, i, len(chans), k)
			}
		}
		for _, c := range cls {
			c.Close()
		}
		if len(errs) > 0 {
			t.Errorf("%s: %d Lock or Unlock errors, first: %v", name, len(errs), errs[0])
		}
		if acq == 0 {
			t.Fatalf("%s: no acquisition in %ds", name, secs)
		}
		d := diffStats(readStats(t, shared), before)
		per := float64(acq * rc.N())
		var calls float64
		for _, c := range d {
			calls += c.Calls
		}
		return result{acq: acq, perNode: calls / per, publish: d["publish"].Calls / per}
	}
	// Interleaved, so that a slow spell of a shared machine falls on both.
	ownR, sharedR := run("own", true), run("shared", false)
	var b strings.Builder
	fmt.Fprintf(&b, "%d Clients, one key, hold 0, %d nodes, %ds each:\n", k, rc.N(), secs)
	for _, r := range []struct {
		name string
		r    result
	}{{"own node clients", ownR}, {"shared node clients", sharedR}} {
		fmt.Fprintf(&b, "%-20s %6.0f acq/s  %5.2f commands/acq/node  %4.2f PUBLISH/acq/node\n",
			r.name, float64(r.r.acq)/float64(secs), r.r.perNode, r.r.publish)
	}
	t.Log("\n" + b.String())
	// Commands per acquisition are counts, not times: the same within a
	// few percent under any load (12.0 and 11.8 on 5 nodes, issue 41);
	// allow a quarter more before calling it a cost of sharing.
	if sharedR.perNode > 1.25*ownR.perNode {
		t.Errorf("shared node clients: %.2f commands per acquisition per node; own: %.2f; want no more than a quarter more", sharedR.perNode, ownR.perNode)
	}
	for _, r := range []result{ownR, sharedR} {
		if r.publish > 1.05 {
			t.Errorf("%.2f PUBLISH per acquisition per node; want at most one (a release tells the head waiter's Client only)", r.publish)
		}
	}
}

// nodeClients opens a client of its own to each node of rc, with the
// benchmarks' common settings, closed when the test ends: the connections
// of one process.
func nodeClients(t *testing.T, rc *redistest.Cluster) []redis.UniversalClient {
	t.Helper()
	var cs []redis.UniversalClient
	for i := range rc.N() {
		cs = append(cs, redis.NewClient(nodes.Options(rc.ServerAddr(i))))
	}
	t.Cleanup(func() { nodes.CloseAll(cs) })
	return cs
}

// adminClients returns rc's admin clients (the harness's own, for INFO and
// reads of the nodes' state), one a node.
func adminClients(rc *redistest.Cluster) []redis.UniversalClient {
	admins := make([]redis.UniversalClient, rc.N())
	for i := range admins {
		admins[i] = rc.Admin(i)
	}
	return admins
}

// newRedlock returns a redlock Client of nodes with opts, closed when the
// test ends.
func newRedlock(t *testing.T, nodes []redis.UniversalClient, opts ...redlock.Option) *redlock.Client {
	t.Helper()
	c, err := redlock.New(nodes, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
