package holder_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/holder"
	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup returns a Client on three real nodes holding a lock on resource,
// and the holder.Nodes of that lock's keys.
func setup(t *testing.T, resource string) (*redistest.Cluster, *redlock.Lock, *holder.Nodes) {
	t.Helper()
	rc := redistest.Start(t, 3)
	client, err := redlock.New(rc.Clients())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l := lockEverywhere(t, rc, client, resource)
	t.Cleanup(func() { _ = l.Unlock(context.Background()) })
	link, err := node.LinkOf(client)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{redlock.DefaultKeyPrefix + resource, redlock.DefaultKeyPrefix + resource, redlock.DefaultKeyPrefix + resource}
	return rc, l, holder.New(link, "test", rc.Clients(), keys, 0)
}

// lockEverywhere returns a lock on resource whose key holds its token on
// every node: the tests write identities on each node, and TryLock returns
// at a majority, so on a loaded machine the third node's grant can land
// after a write that needs it, or past its not-after bound and never (one
// failure in 30 runs beside two busy loops: "v" "v" ""). It tries again
// for up to 30s, giving each lock 2s to land everywhere.
func lockEverywhere(t *testing.T, rc *redistest.Cluster, client *redlock.Client, resource string) *redlock.Lock {
	t.Helper()
	ctx := context.Background()
	key := redlock.DefaultKeyPrefix + resource
	everywhere := func(token string) bool {
		for i := range rc.N() {
			if v, _ := rc.Admin(i).Get(ctx, key).Result(); v != token {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := client.TryLock(ctx, resource, redlock.WithTTL(10*time.Second))
		if err == nil {
			for landed := time.Now().Add(2 * time.Second); time.Now().Before(landed); time.Sleep(5 * time.Millisecond) {
				if everywhere(l.Token()) {
					return l
				}
			}
			_ = l.Unlock(ctx)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lock on %q held on every node for 30s (last TryLock: %v)", resource, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// identities returns, per node, the identity key's value ("" when absent).
func identities(t *testing.T, rc *redistest.Cluster, hn *holder.Nodes) []string {
	t.Helper()
	out := make([]string, rc.N())
	for i := range out {
		v, _ := rc.Admin(i).Get(context.Background(), hn.Key(i)).Result()
		out[i] = v
	}
	return out
}

// A write lands only where the lock key holds the token given, and its
// identity lasts no longer than the lock key.
func TestNodes_proclaimOnlyWhereHeld(t *testing.T) {
	rc, l, hn := setup(t, "holder-held")
	ctx := context.Background()
	if tl := hn.Proclaim(ctx, "not-the-token", "v", "term-1"); tl.Yes != 0 {
		t.Fatalf("Proclaim with another token: %d nodes wrote, want 0", tl.Yes)
	}
	if got := identities(t, rc, hn); got[0] != "" || got[1] != "" || got[2] != "" {
		t.Fatalf("identities after a refused write: %q", got)
	}
	if tl := hn.Proclaim(ctx, l.Token(), "v", "term-1"); !tl.Quorum() {
		t.Fatalf("Proclaim with the lock's token: %d nodes wrote, want a majority", tl.Yes)
	}
	// Proclaim returns at a majority; give the last node its node timeout.
	deadline := time.Now().Add(5 * time.Second)
	for got := identities(t, rc, hn); got[0] == "" || got[1] == "" || got[2] == ""; got = identities(t, rc, hn) {
		if time.Now().After(deadline) {
			t.Fatalf("identities 5s after Proclaim: %q, want one on every node", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range rc.N() {
		idTTL := rc.Admin(i).PTTL(ctx, hn.Key(i)).Val()
		lockTTL := rc.Admin(i).PTTL(ctx, redlock.DefaultKeyPrefix+"holder-held").Val()
		if idTTL <= 0 || idTTL > lockTTL+10*time.Millisecond {
			t.Errorf("node %d: identity TTL %v, lock key's %v: want positive and no longer", i, idTTL, lockTTL)
		}
	}
}

// After Withdraw no write of the term lands again, while a new term's does.
func TestNodes_withdrawEndsTheTerm(t *testing.T) {
	rc, l, hn := setup(t, "holder-withdraw")
	ctx := context.Background()
	if tl := hn.Proclaim(ctx, l.Token(), "v1", "term-1"); !tl.Quorum() {
		t.Fatalf("Proclaim: %d nodes wrote", tl.Yes)
	}
	// quorum.All: Withdraw returns once every node answered, so no write
	// of the term sent afterwards lands anywhere (with quorum.Majority a
	// node's withdraw may still be on its way, and a write sent now may
	// land there first: a minority, which the doc allows — one failure in
	// 30 runs beside the helpers' load, "landed on 1 nodes").
	if tl := hn.Withdraw(ctx, "v1", "term-1", quorum.All); tl.Yes != rc.N() {
		t.Fatalf("Withdraw: %d nodes answered, want all %d", tl.Yes, rc.N())
	}
	// The identities are gone everywhere (Withdraw waited for every node).
	deadline := time.Now().Add(5 * time.Second)
	for got := identities(t, rc, hn); got[0] != "" || got[1] != "" || got[2] != ""; got = identities(t, rc, hn) {
		if time.Now().After(deadline) {
			t.Fatalf("identities 5s after Withdraw: %q, want none", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tl := hn.Proclaim(ctx, l.Token(), "v1", "term-1"); tl.Yes != 0 {
		t.Fatalf("a write of the withdrawn term landed on %d nodes", tl.Yes)
	}
	if tl := hn.Proclaim(ctx, l.Token(), "v2", "term-2"); !tl.Quorum() {
		t.Fatalf("a new term's write: %d nodes wrote, want a majority", tl.Yes)
	}
	// quorum.Majority (election's): a write of the term sent afterwards
	// can land only where a withdraw is still on its way, a minority.
	if tl := hn.Withdraw(ctx, "v2", "term-2", quorum.Majority); !tl.Quorum() {
		t.Fatalf("Withdraw: %d nodes answered", tl.Yes)
	}
	if tl := hn.Proclaim(ctx, l.Token(), "v2", "term-2"); tl.Quorum() {
		t.Fatalf("a write of the withdrawn term landed on %d nodes, a majority", tl.Yes)
	}
}
