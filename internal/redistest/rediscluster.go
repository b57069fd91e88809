package redistest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterReady bounds the wait for a new Redis Cluster to agree on its
// slots, after redis-cli created it.
const clusterReady = 20 * time.Second

// RedisCluster is a Redis Cluster of masters without replicas on
// 127.0.0.1, created with redis-cli --cluster create, as an operator would.
// (Not to be confused with Cluster, a set of independent servers.)
//
// A t.Cleanup stops every process, closes the clients it made, and logs the
// servers' logs when the test failed.
type RedisCluster struct {
	tb      testing.TB
	servers []*server

	mu      sync.Mutex // protects clients
	clients []interface{ Close() error }
}

// StartRedisCluster starts masters servers with cluster-enabled yes (each
// with its bus on a second free port), creates the cluster with redis-cli,
// and waits until every node reports cluster_state:ok and knows every other.
//
// It skips the test (fails it when CI is set) without redis-server or
// redis-cli. Of the options, WithArgs (appended to every server's command
// line) and WithClockOffset apply; it logs through t.
func StartRedisCluster(t testing.TB, masters int, opts ...Option) *RedisCluster {
	t.Helper()
	requireServer(t)
	cli := require(t, "redis-cli", InstallHint)
	dir := t.TempDir()
	cfg := buildConfig(config{}, opts)
	env := clockEnv(t, dir, masters, cfg)
	c := &RedisCluster{tb: t}
	t.Cleanup(func() {
		if t.Failed() {
			logsOf(t.Logf, c.servers...)
		}
		c.close()
	})

	servers := make([]*server, masters)
	errs := make([]error, masters)
	var wg sync.WaitGroup
	for i := range masters {
		wg.Go(func() {
			bus, err := freePort()
			if err != nil {
				errs[i] = err
				return
			}
			d := filepath.Join(dir, "node"+strconv.Itoa(i))
			args := append([]string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(d, "nodes.conf"),
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-node-timeout", "5000"}, cfg.args...)
			servers[i], errs[i] = startServerEnv(d, env[i], args...)
		})
	}
	wg.Wait()
	for _, s := range servers {
		if s != nil {
			c.servers = append(c.servers, s)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: start cluster nodes: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReady)
	defer cancel()
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if err := c.waitReady(ctx); err != nil {
		t.Fatalf("redistest: cluster not ready: %v", err)
	}
	if err := checkClockOffsets(ctx, c.Addrs(), cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *RedisCluster) waitReady(ctx context.Context) error {
	for {
		err := c.ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *RedisCluster) ready(ctx context.Context) error {
	for _, s := range c.servers {
		cl := directClient(s.addr())
		info, err := cl.ClusterInfo(ctx).Result()
		cl.Close()
		if err != nil {
			return err
		}
		if st := infoField(info, "cluster_state"); st != "ok" {
			return fmt.Errorf("%s: cluster_state %q", s.addr(), st)
		}
		if n := infoField(info, "cluster_known_nodes"); n != strconv.Itoa(len(c.servers)) {
			return fmt.Errorf("%s: cluster_known_nodes %s", s.addr(), n)
		}
	}
	return nil
}

// Addrs returns the nodes' addresses.
func (c *RedisCluster) Addrs() []string {
	var out []string
	for _, s := range c.servers {
		out = append(out, s.addr())
	}
	return out
}

// URL returns the cluster as a redlock.Dial URL:
// redis+cluster://<node>?addr=<node>&addr=<node>.
func (c *RedisCluster) URL() string {
	a := c.Addrs()
	if len(a) == 1 {
		return "redis+cluster://" + a[0]
	}
	return "redis+cluster://" + a[0] + "?" + url.Values{"addr": a[1:]}.Encode()
}

// Client returns a new cluster client with ContextTimeoutEnabled. The
// cleanup closes it.
func (c *RedisCluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		DialTimeout:           ClientDialTimeout,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
	c.track(cl)
	return cl
}

// NodeClient returns a new client connected directly to node i. The cleanup
// closes it.
func (c *RedisCluster) NodeClient(i int) *redis.Client {
	cl := directClient(c.servers[i].addr())
	c.track(cl)
	return cl
}

func (c *RedisCluster) track(cl interface{ Close() error }) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clients = append(c.clients, cl)
}

func (c *RedisCluster) close() {
	c.mu.Lock()
	clients := c.clients
	c.clients = nil
	c.mu.Unlock()
	for _, cl := range clients {
		cl.Close()
	}
	var wg sync.WaitGroup
	for _, s := range c.servers {
		wg.Go(s.kill)
	}
	wg.Wait()
}
