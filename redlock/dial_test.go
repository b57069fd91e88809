package redlock

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/redis/go-redis/v9"
)

func TestDial_invalidArguments(t *testing.T) {
	t.Parallel()
	ms, _ := miniNodes(t, 1)
	good := "redis://" + ms[0].Addr()
	cases := []struct {
		name string
		urls []string
		opts []Option
	}{
		{"no URLs", nil, nil},
		{"unknown scheme", []string{"http://127.0.0.1:6379"}, nil},
		{"unknown kind", []string{"redis+ring://127.0.0.1:6379"}, nil},
		{"unix with a kind", []string{"unix+cluster:///tmp/r.sock"}, nil},
		{"unparsable", []string{"redis://user:se cret@host:6379"}, nil},
		{"bad port", []string{"redis://h:port"}, nil},
		{"unknown option", []string{"redis://127.0.0.1:6379?bogus=1"}, nil},
		{"sentinel without master_name", []string{"redis+sentinel://127.0.0.1:26379"}, nil},
		{"sentinel reading replicas", []string{"redis+sentinel://127.0.0.1:26379?master_name=m&replica_only=true"}, nil},
		// go-redis panics on these with a failover client; Dial must not.
		{"sentinel route_randomly", []string{"redis+sentinel://127.0.0.1:26379?master_name=m&route_randomly=true"}, nil},
		{"sentinel route_by_latency", []string{"redis+sentinel://127.0.0.1:26379?master_name=m&route_by_latency=true"}, nil},
		{"one bad among good", []string{good, "redis://127.0.0.1:6379/x"}, nil},
		// go-redis would send no pipelined command (a release) and report
		// success; -1 (no retries) is fine.
		{"max_retries below -1", []string{"redis://127.0.0.1:6379?max_retries=-2"}, nil},
		{"sentinel max_retries below -1", []string{"redis+sentinel://127.0.0.1:26379?master_name=m&max_retries=-5"}, nil},
		{"cluster max_redirects below -1", []string{"redis+cluster://127.0.0.1:7000?max_redirects=-2"}, nil},
		{"cluster max_retries below -1", []string{"redis+cluster://127.0.0.1:7000?max_retries=-2"}, nil},
		// go-redis allocates pools when it builds a client: 1e8 was a fatal
		// out-of-memory error.
		{"pool_size too large", []string{"redis://127.0.0.1:6379?pool_size=100000000"}, nil},
		{"sentinel pipeline_pool_size too large", []string{"redis+sentinel://127.0.0.1:26379?master_name=m&pipeline_pool_size=100000000"}, nil},
		{"cluster pool_size too large", []string{"redis+cluster://127.0.0.1:7000?pool_size=100000000"}, nil},
		{"buffer too large", []string{"redis://127.0.0.1:6379?pipeline_read_buffer_size=2000000000"}, nil},
		{"bad option", []string{good}, []Option{WithTTL(-1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Dial(t.Context(), tc.urls, tc.opts...)
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Dial(%q) = %v, %v; want ErrInvalidArgument", tc.urls, c, err)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}

func TestDial_errorsRedactPasswords(t *testing.T) {
	t.Parallel()
	cases := []string{
		"redis://user:hunter2@127.0.0.1:6379?bogus=1",
		"redis://user:hunter2@127.0.0.1:6379/notadb",
		"redis+sentinel://u:hunter2@127.0.0.1:26379?password=hunter2&bogus=1",
		"redis+sentinel://127.0.0.1:26379?master_name=m&password=hunter2&sentinel_password=hunter2&replica_only=true",
		"redis://user:hunter2@host:port",
		"redis://user:hunter2 x@host:6379",
	}
	for _, u := range cases {
		_, err := Dial(t.Context(), []string{u})
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Dial(%q) = %v; want ErrInvalidArgument", u, err)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Dial(%q) = %q; the error shows the password", u, err)
		}
	}
}

func TestDial_buildsOwnedClients(t *testing.T) {
	t.Parallel()
	ms, _ := miniNodes(t, 3)
	var urls []string
	for _, m := range ms {
		urls = append(urls, "redis://"+m.Addr()+"/0?pool_size=4")
	}
	c, err := Dial(t.Context(), urls)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		o := n.C.(*redis.Client).Options()
		if !o.ContextTimeoutEnabled || o.PoolSize != 4 || o.Addr != ms[i].Addr() {
			t.Errorf("node %d options: ContextTimeoutEnabled %v, PoolSize %d, Addr %s; want true, 4 (from the URL), %s",
				i, o.ContextTimeoutEnabled, o.PoolSize, o.Addr, ms[i].Addr())
		}
	}
	l, err := c.Lock(t.Context(), "dial")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	nodes := c.nodes
	if err := c.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	for i, n := range nodes {
		if err := n.C.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
			t.Errorf("node %d Ping after Close = %v; want redis.ErrClosed (Close closes what Dial built)", i, err)
		}
	}
}

// deadAddr returns an address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// nodeErrs records the node errors reported to hooks.
type nodeErrs struct {
	NoHooks
	mu   sync.Mutex
	seen []NodeErrorInfo
}

func (h *nodeErrs) NodeError(_ context.Context, i NodeErrorInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, i)
}

func TestDial_pingToleratesAMinorityDown(t *testing.T) {
	t.Parallel()
	ms, _ := miniNodes(t, 2)
	urls := []string{"redis://" + ms[0].Addr(), "redis://" + deadAddr(t), "redis://" + ms[1].Addr()}
	h := &nodeErrs{}
	// The dead node refuses at once; the node timeout only bounds the live
	// ones, and must be out of reach of a loaded machine (300ms was not:
	// Dial's PING to miniredis under -race at load 12 missed it).
	c := dialT(t, urls, WithHooks(h), WithNodeTimeout(5*time.Second))
	// miniredis has neither ROLE nor INFO server: nodes 0 and 2 are
	// reported as not verified, which is no failure.
	var failed, unverified []NodeErrorInfo
	for _, ne := range h.seen {
		if errors.Is(ne.Err, nodecheck.ErrUnverified) {
			unverified = append(unverified, ne)
		} else {
			failed = append(failed, ne)
		}
	}
	if len(failed) != 1 || failed[0].Op != "dial" || failed[0].Node != 1 {
		t.Errorf("node failures reported = %+v; want one, Op dial, node 1", failed)
	}
	if len(unverified) != 2 || unverified[0].Op != "dial" || unverified[0].Kind != "reply" {
		t.Errorf("nodes reported as not verified = %+v; want 2 (miniredis lacks ROLE), Op dial, Kind reply", unverified)
	}
	l, err := c.TryLock(t.Context(), "m")
	if err != nil {
		t.Fatalf("TryLock with 1 of 3 down = %v", err)
	}
	l.Unlock(t.Context())
}

func TestDial_pingNeedsAMajority(t *testing.T) {
	t.Parallel()
	ms, _ := miniNodes(t, 1)
	urls := []string{"redis://" + ms[0].Addr(), "redis://" + deadAddr(t), "redis://" + deadAddr(t)}
	_, err := Dial(t.Context(), urls, WithNodeTimeout(200*time.Millisecond), WithTTL(5*time.Second))
	var ne *NodeError
	if !errors.Is(err, ErrNoQuorum) || !errors.As(err, &ne) {
		t.Errorf("Dial with 2 of 3 down = %v; want ErrNoQuorum joined with *NodeError", err)
	}
}

func TestDial_pingBoundedByCtx(t *testing.T) {
	t.Parallel()
	// A listener that accepts and never answers: PING hangs until ctx ends.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	conns.Go(func() {
		var open []net.Conn
		defer func() {
			for _, c := range open {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			open = append(open, c)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Dial(ctx, []string{"redis://" + ln.Addr().String()})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Dial to a silent node took %v; want it bounded by the 200ms ctx", d)
	}
	if !errors.Is(err, ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial to a silent node = %v; want ErrNoQuorum with the deadline error", err)
	}
}

func TestDial_wrongPasswordFailsAtOnce(t *testing.T) {
	t.Parallel()
	ms, _ := miniNodes(t, 3)
	ms[1].RequireAuth("right")
	var urls []string
	for i, m := range ms {
		pw := ""
		if i == 1 {
			pw = ":wrong@"
		}
		urls = append(urls, "redis://"+pw+m.Addr())
	}
	// A majority answers, yet a node that refuses our credentials is a
	// configuration error that waiting will not fix.
	_, err := Dial(t.Context(), urls)
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Node != 1 || !redis.HasErrorPrefix(ne.Err, "WRONGPASS") {
		t.Errorf("Dial with a wrong password on node 1 = %v; want a *NodeError for node 1 with the WRONGPASS reply", err)
	}
	if err != nil && strings.Contains(err.Error(), "wrong") && !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("Dial error %q may show the password", err)
	}
}

func TestDial_clusterAndSentinelURLsBuildTheirClients(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		want string
	}{
		{"redis+cluster://127.0.0.1:1?addr=127.0.0.1:2", "*redis.ClusterClient"},
		{"redis+sentinel://127.0.0.1:1?master_name=m&addr=127.0.0.1:2", "*redis.Client"},
		{"rediss+cluster://127.0.0.1:1", "*redis.ClusterClient"},
	} {
		n, addr, err := dialURL(tc.url, nil)
		if err != nil {
			t.Errorf("dialURL(%q) = %v", tc.url, err)
			continue
		}
		switch c := n.(type) {
		case *redis.ClusterClient:
			if tc.want != "*redis.ClusterClient" || !c.Options().ContextTimeoutEnabled {
				t.Errorf("dialURL(%q) = cluster client (ContextTimeoutEnabled %v); want %s with it set", tc.url, c.Options().ContextTimeoutEnabled, tc.want)
			}
			if strings.HasPrefix(tc.url, "rediss") && c.Options().TLSConfig == nil {
				t.Errorf("dialURL(%q): no TLS config", tc.url)
			}
		case *redis.Client:
			if tc.want != "*redis.Client" || !c.Options().ContextTimeoutEnabled || addr != "sentinel(m@127.0.0.1:1,127.0.0.1:2)" {
				t.Errorf("dialURL(%q) = client (ContextTimeoutEnabled %v), addr %q; want %s with it set, named after the Sentinels",
					tc.url, c.Options().ContextTimeoutEnabled, addr, tc.want)
			}
		}
		n.Close()
	}
}

func TestDial_tlsConfigIsClonedPerURL(t *testing.T) {
	t.Parallel()
	user := &tls.Config{MinVersion: tls.VersionTLS13}
	n, _, err := dialURL("rediss://db.example:6380?skip_verify=true", user)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	got := n.(*redis.Client).Options().TLSConfig
	if got == user || got.ServerName != "db.example" || !got.InsecureSkipVerify || got.MinVersion != tls.VersionTLS13 {
		t.Errorf("TLS config = %p {ServerName %q, InsecureSkipVerify %v, MinVersion %x}; want a clone of %p with ServerName from the URL and skip_verify",
			got, got.ServerName, got.InsecureSkipVerify, got.MinVersion, user)
	}
	if user.ServerName != "" {
		t.Errorf("the caller's TLS config was modified: ServerName %q", user.ServerName)
	}
	plain, _, err := dialURL("redis://127.0.0.1:6379", user)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if plain.(*redis.Client).Options().TLSConfig != nil {
		t.Errorf("redis:// URL got a TLS config; want none")
	}
}

func TestDial_sentinelNodeNamed(t *testing.T) {
	t.Parallel()
	// Nothing listens there: Dial fails on PING, naming the node after its
	// master and Sentinels, not after go-redis's placeholder "FailoverClient".
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	sentinel := deadAddr(t)
	_, err := Dial(ctx, []string{"redis+sentinel://" + sentinel + "?master_name=m"}, WithTTL(time.Second))
	var ne *NodeError
	if want := "sentinel(m@" + sentinel + ")"; !errors.Is(err, ErrNoQuorum) || !errors.As(err, &ne) || ne.Addr != want {
		t.Errorf("Dial to no Sentinel = %v; want ErrNoQuorum with a *NodeError whose Addr is %q", err, want)
	}
}
