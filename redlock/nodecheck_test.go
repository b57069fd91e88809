package redlock

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/quorumlock/quorumlock/internal/redistest"
)

// Tests in this file check that unsafe node lists are refused: one server
// counted twice, or a replica counted as a master, is not a majority.

// wantRefused checks that err matches ErrInvalidArgument and names every
// one of names (indexes, URLs), and shows none of hidden.
func wantRefused(t *testing.T, call string, err error, names []string, hidden ...string) {
	t.Helper()
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("%s = %v; want ErrInvalidArgument", call, err)
		return
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("%s = %q; want it to name %s", call, err, n)
		}
	}
	t.Logf("%s: %v", call, err)
	for _, h := range hidden {
		if strings.Contains(err.Error(), h) {
			t.Errorf("%s = %q; it shows %q", call, err, h)
		}
	}
}

func TestNew_refusesUnsafeNodes(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 2)
	a, b := rc.Client(0), rc.Client(1)
	// Two clients of one address: another pool, the same server.
	a2 := redis.NewClient(&redis.Options{Addr: rc.Addr(0), ContextTimeoutEnabled: true})
	aDB1 := redis.NewClient(&redis.Options{Addr: rc.Addr(0), DB: 1, ContextTimeoutEnabled: true})
	cl1 := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001"}})
	cl2 := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7001", "127.0.0.1:7002"}})
	// go-redis maps -1 to 0 (no retry) and runs a pipeline MaxRetries+1
	// times: below -1 it sends nothing and reports success, so an Unlock
	// would leave the key. A Cluster client does so for every command.
	noSend := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -5})
	clNoRedirect := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7003"}, MaxRedirects: -2})
	clNoRetry := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7004"}, MaxRetries: -2})
	for _, c := range []interface{ Close() error }{a2, aDB1, cl1, cl2, noSend, clNoRedirect, clNoRetry} {
		t.Cleanup(func() { c.Close() })
	}

	cases := []struct {
		name  string
		nodes []redis.UniversalClient
		named []string
	}{
		{"same client twice", []redis.UniversalClient{a, b, a}, []string{"nodes[0]", "nodes[2]"}},
		{"two clients on one address", []redis.UniversalClient{a, b, a2}, []string{"nodes[0]", "nodes[2]", rc.Addr(0)}},
		{"two databases of one server", []redis.UniversalClient{b, a, aDB1}, []string{"nodes[1]", "nodes[2]"}},
		{"cluster clients sharing a seed", []redis.UniversalClient{cl1, a, cl2}, []string{"nodes[0]", "nodes[2]", "127.0.0.1:7001"}},
		{"MaxRetries below -1", []redis.UniversalClient{a, b, noSend}, []string{"nodes[2]", "MaxRetries"}},
		{"cluster MaxRedirects below -1", []redis.UniversalClient{clNoRedirect, a, b}, []string{"nodes[0]", "MaxRedirects"}},
		{"cluster MaxRetries below -1", []redis.UniversalClient{a, clNoRetry, b}, []string{"nodes[1]", "MaxRetries"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.nodes)
			if c != nil {
				c.Close()
			}
			wantRefused(t, "New", err, tc.named)
		})
	}

	t.Run("distinct nodes", func(t *testing.T) {
		// Failover clients carry no address (go-redis names them all
		// "FailoverClient"): New cannot compare them, Dial does.
		// MaxRetries -1 means no retry, and is fine.
		f1 := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m1", SentinelAddrs: []string{"127.0.0.1:1"}, MaxRetries: -1})
		f2 := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m2", SentinelAddrs: []string{"127.0.0.1:2"}})
		t.Cleanup(func() { f1.Close(); f2.Close() })
		c, err := New([]redis.UniversalClient{a, b, f1, f2, cl1})
		if err != nil {
			t.Fatalf("New(distinct nodes) = %v", err)
		}
		c.Close()
	})
}

// replicaOf makes node i of rc a replica of node j's server.
func replicaOf(t *testing.T, rc *redistest.Cluster, i, j int) {
	t.Helper()
	host, port, _ := net.SplitHostPort(rc.ServerAddr(j))
	if err := rc.Admin(i).ReplicaOf(t.Context(), host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF on node %d: %v", i, err)
	}
}

func TestDial_refusesUnsafeNodes(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	_, port, _ := net.SplitHostPort(rc.ServerAddr(0))
	u := func(addr string) string { return "redis://" + addr }
	// Every case has a majority of good nodes: only the check refuses it.
	cases := []struct {
		name   string
		urls   []string
		named  []string
		hidden []string
	}{
		{"same URL twice",
			[]string{u(rc.Addr(0)), u(rc.Addr(1)), u(rc.Addr(0))},
			[]string{"urls[0]", "urls[2]", u(rc.Addr(0))}, nil},
		{"same address, another database",
			[]string{u(rc.Addr(0)) + "/0", u(rc.Addr(1)), u(rc.Addr(0)) + "/3"},
			[]string{"urls[0]", "urls[2]"}, nil},
		{"same URL twice, password redacted",
			[]string{"redis://:hunter2@" + rc.Addr(0), u(rc.Addr(1)), "redis://:hunter2@" + rc.Addr(0)},
			[]string{"urls[0]", "urls[2]"}, []string{"hunter2"}},
		// Two addresses, one server: only its run_id tells.
		{"a server and its proxy",
			[]string{u(rc.Addr(0)), u(rc.Addr(1)), u(rc.ServerAddr(0))},
			[]string{"urls[0]", "urls[2]", "run_id", u(rc.ServerAddr(0))}, nil},
		{"127.0.0.1 and localhost",
			[]string{u(rc.ServerAddr(0)), u(rc.Addr(1)), u(net.JoinHostPort("localhost", port))},
			[]string{"urls[0]", "urls[2]", "run_id", "localhost"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "localhost") {
				if hosts, _ := net.LookupHost("localhost"); !slices.Contains(hosts, "127.0.0.1") {
					t.Skipf("localhost resolves to %v here, not 127.0.0.1", hosts)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			c, err := dialAgain(t, ctx, tc.urls)
			if c != nil {
				c.Close()
			}
			wantRefused(t, "Dial", err, tc.named, tc.hidden...)
		})
	}

	// Last, as it changes node 2 for good.
	t.Run("a replica", func(t *testing.T) {
		replicaOf(t, rc, 2, 0)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		urls := urlsOf("redis", "", proxyAddrs(rc)...)
		c, err := dialAgain(t, ctx, urls)
		if c != nil {
			c.Close()
		}
		wantRefused(t, "Dial with node 2 a replica", err, []string{"urls[2]", urls[2], "not a master", "slave"})
		if err != nil && strings.Contains(err.Error(), "urls[0]") {
			t.Errorf("Dial = %q; it also names urls[0], which is a master", err)
		}
	})
}

// seenNow returns a copy of what h recorded so far.
func (h *nodeErrs) seenNow() []NodeErrorInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]NodeErrorInfo(nil), h.seen...)
}

func TestDial_aclWithoutRoleOrInfo(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	setUser(t, rc, "locker", minimalACL)
	setUser(t, rc, "checked", minimalACL+" +role +info")
	addrs := proxyAddrs(rc)

	t.Run("minimal ACL: not verified, reported, usable", func(t *testing.T) {
		h := &nodeErrs{}
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		c := dialT(t, urlsOf("redis", "locker:pw", addrs...), WithHooks(h), WithLogger(logger))
		seen := h.seenNow()
		if len(seen) != rc.N() {
			t.Errorf("node errors reported = %+v; want one per node", seen)
		}
		for _, ne := range seen {
			if ne.Op != "dial" || ne.Kind != "reply" || !errors.Is(ne.Err, nodecheck.ErrUnverified) || !strings.Contains(ne.Err.Error(), "NOPERM") {
				t.Errorf("node error %+v; want Op dial, Kind reply, not verified because of NOPERM", ne)
			}
		}
		if got := logs.String(); strings.Count(got, "op=dial") != rc.N() || !strings.Contains(got, "NOPERM") {
			t.Errorf("log = %q; want one warning with op=dial and the NOPERM reply per node", got)
		}
		l, err := c.TryLock(t.Context(), "acl-unverified")
		if err != nil {
			t.Fatalf("TryLock = %v", err)
		}
		l.Unlock(t.Context())
	})

	t.Run("with +role +info: verified", func(t *testing.T) {
		h := &nodeErrs{}
		dialT(t, urlsOf("redis", "checked:pw", addrs...), WithHooks(h))
		if seen := h.seenNow(); len(seen) != 0 {
			t.Errorf("node errors reported = %+v; want none", seen)
		}
		// The same user on two names of one server is refused.
		urls := urlsOf("redis", "checked:pw", addrs[0], addrs[1], rc.ServerAddr(0))
		_, err := Dial(t.Context(), urls)
		wantRefused(t, "Dial", err, []string{"urls[0]", "urls[2]", "run_id"}, ":pw@")
	})
}
