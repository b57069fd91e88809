package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the Sentinels of StartSentinel monitor.
const SentinelMaster = "quorumlock"

const (
	// sentinelDownAfter is how long a master must not answer before a
	// Sentinel deems it down: short, so that tests fail over quickly. A
	// Sentinel pings every second, or every down-after period if shorter.
	sentinelDownAfter = 500 * time.Millisecond
	// sentinelReady bounds the wait for the Sentinels to find the replica
	// and each other: they announce themselves every 2s.
	sentinelReady = 15 * time.Second
)

// Sentinel is a Sentinel-managed master group on 127.0.0.1: a master, one
// replica, and three Sentinels that monitor them with a quorum of 2.
// CutReplication stops replication without stopping either server.
//
// Methods call t.Fatalf on failure: call them from the test's goroutine. A
// t.Cleanup stops every process, closes the clients it made, and logs the
// servers' logs when the test failed.
type Sentinel struct {
	tb        testing.TB
	servers   []*server // [0] the first master, [1] the first replica
	sentinels []*server

	mu      sync.Mutex // protects clients
	clients []interface{ Close() error }
}

// StartSentinel starts the group and waits until every Sentinel knows the
// replica and the two other Sentinels, and the replica is in sync, so that
// a failover can happen as soon as the master fails. It takes a few seconds:
// Sentinels discover each other through hello messages sent every 2s.
//
// It skips the test (fails it when CI is set) without redis-server, which
// also runs the Sentinels (redis-server --sentinel).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	path := requireServer(t)
	dir := t.TempDir()
	s := &Sentinel{tb: t}
	t.Cleanup(func() {
		if t.Failed() {
			logsOf(t.Logf, append(s.servers, s.sentinels...)...)
		}
		s.close()
	})

	master, err := startServer(filepath.Join(dir, "master"))
	if err != nil {
		t.Fatalf("redistest: start master: %v", err)
	}
	s.servers = append(s.servers, master)
	// The replica replicates from the master directly. (Through a proxy,
	// the Sentinels see it replicate from an address that is not the
	// master's and, failover-timeout after they found it, reconfigure it
	// to the master's own (+fix-slave-config): a cut proxy then cut
	// nothing, and a test's "replica has the key" check failed whenever
	// setup had been slow enough.)
	host, port, _ := net.SplitHostPort(master.addr())
	replica, err := startServer(filepath.Join(dir, "replica"), "--replicaof", host, port)
	if err != nil {
		t.Fatalf("redistest: start replica: %v", err)
	}
	s.servers = append(s.servers, replica)

	errs := make([]error, 3)
	sents := make([]*server, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			sents[i], errs[i] = startSentinel(path, filepath.Join(dir, "sentinel"+strconv.Itoa(i)), master.port)
		})
	}
	wg.Wait()
	for _, sn := range sents {
		if sn != nil {
			s.sentinels = append(s.sentinels, sn)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: start sentinels: %v", err)
	}
	if err := s.waitReady(); err != nil {
		t.Fatalf("redistest: sentinel group not ready: %v", err)
	}
	return s
}

// startSentinel writes a Sentinel config monitoring the master on
// masterPort and starts a Sentinel with it on a free port.
func startSentinel(path, dir string, masterPort int) (*server, error) {
	if err := resetDir(dir); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	// The Sentinel rewrites this file as it learns the topology.
	body := fmt.Sprintf(`sentinel resolve-hostnames no
sentinel monitor %[1]s 127.0.0.1 %[2]d 2
sentinel down-after-milliseconds %[1]s %[3]d
sentinel failover-timeout %[1]s 5000
sentinel parallel-syncs %[1]s 1
`, SentinelMaster, masterPort, sentinelDownAfter.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return nil, err
	}
	s := &server{dir: dir}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := []string{conf, "--sentinel",
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
			"--dir", dir, "--loglevel", "warning"}
		p, err := startProcess(path, args, dir, port, s.logPath())
		if err == nil {
			s.port, s.proc = port, p
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return nil, err
		}
	}
}

// waitReady polls until every Sentinel sees the replica (not down) and the
// two other Sentinels, and the replica's link to the master is up.
func (s *Sentinel) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), sentinelReady)
	defer cancel()
	var last error
	for {
		if last = s.ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Sentinel) ready(ctx context.Context) error {
	for i, sn := range s.sentinels {
		sc := redis.NewSentinelClient(clientOptions(sn.addr()))
		replicas, err := sc.Replicas(ctx, SentinelMaster).Result()
		if err == nil && (len(replicas) != 1 || replicas[0]["flags"] != "slave") {
			err = fmt.Errorf("replicas %v", replicas)
		}
		if err == nil {
			var others []map[string]string
			if others, err = sc.Sentinels(ctx, SentinelMaster).Result(); err == nil && len(others) != len(s.sentinels)-1 {
				err = fmt.Errorf("knows %d other sentinels", len(others))
			}
		}
		sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %d: %w", i, err)
		}
	}
	if link := s.linkStatus(ctx, s.servers[1]); link != "up" {
		return fmt.Errorf("replica: master_link_status %q", link)
	}
	return nil
}

// linkStatus returns the master_link_status of a replica.
func (s *Sentinel) linkStatus(ctx context.Context, r *server) string {
	c := directClient(r.addr())
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err.Error()
	}
	return infoField(info, "master_link_status")
}

// infoField returns field's value in an INFO reply, or "".
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// SentinelAddrs returns the Sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	var out []string
	for _, sn := range s.sentinels {
		out = append(out, sn.addr())
	}
	return out
}

// URL returns the group as a redlock.Dial URL:
// redis+sentinel://<sentinel>?addr=<sentinel>&addr=<sentinel>&master_name=<name>.
func (s *Sentinel) URL() string {
	addrs := s.SentinelAddrs()
	q := url.Values{"master_name": {SentinelMaster}, "addr": addrs[1:]}
	return "redis+sentinel://" + addrs[0] + "?" + q.Encode()
}

// Client returns a new Sentinel-managed failover client for the group, with
// ContextTimeoutEnabled and no retries. The cleanup closes it.
func (s *Sentinel) Client() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            SentinelMaster,
		SentinelAddrs:         s.SentinelAddrs(),
		DialTimeout:           ClientDialTimeout,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
	s.track(c)
	return c
}

// ServerClient returns a new client connected directly to the server that
// was started as master (0) or as replica (1), whatever its role is now.
// The cleanup closes it.
func (s *Sentinel) ServerClient(i int) *redis.Client {
	c := directClient(s.servers[i].addr())
	s.track(c)
	return c
}

// ServerAddr returns the address of the server started as master (0) or as
// replica (1).
func (s *Sentinel) ServerAddr(i int) string { return s.servers[i].addr() }

// MasterAddr returns the master's address as the first Sentinel that answers
// sees it.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var errs []error
	for _, sn := range s.sentinels {
		if !sn.alive() {
			continue
		}
		sc := redis.NewSentinelClient(clientOptions(sn.addr()))
		a, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		sc.Close()
		if err == nil && len(a) == 2 {
			return net.JoinHostPort(a[0], a[1]), nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("redistest: no sentinel named the master: %w", errors.Join(errs...))
}

// CutReplication cuts the replica off the first master: writes made from
// then on stay on the master, as if the replica lagged behind. The master
// stops accepting SYNC and PSYNC (an ACL change on the default user, which
// clients and Sentinels keep using) and then drops its replica
// connections, so the replica keeps trying to reconnect, and fails.
func (s *Sentinel) CutReplication() {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := directClient(s.servers[0].addr())
	defer c.Close()
	if err := c.Do(ctx, "ACL", "SETUSER", "default", "-sync", "-psync").Err(); err != nil {
		s.tb.Fatalf("redistest: CutReplication: ACL SETUSER on the master: %v", err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		s.tb.Fatalf("redistest: CutReplication: CLIENT KILL TYPE replica on the master: %v", err)
	}
}

// WaitReplicated waits until the replica has acknowledged every write the
// master had received (WAIT 1), at most d.
func (s *Sentinel) WaitReplicated(ctx context.Context, d time.Duration) {
	s.tb.Helper()
	master, err := s.MasterAddr(ctx)
	if err != nil {
		s.tb.Fatal(err)
	}
	c := directClient(master)
	defer c.Close()
	n, err := c.Wait(ctx, 1, d).Result()
	if err != nil || n < 1 {
		s.tb.Fatalf("redistest: WAIT 1 on master %s = %d, %v; want 1", master, n, err)
	}
}

// KillMaster sends SIGKILL to the server that is master now, and returns
// its address.
func (s *Sentinel) KillMaster(ctx context.Context) string {
	s.tb.Helper()
	master, err := s.MasterAddr(ctx)
	if err != nil {
		s.tb.Fatal(err)
	}
	for _, sv := range s.servers {
		if sv.addr() == master {
			sv.kill()
			return master
		}
	}
	s.tb.Fatalf("redistest: master %s is none of ours", master)
	return ""
}

// WaitFailover waits until the Sentinels name a master other than old and
// that server says it is a master, and returns its address. It fails the
// test after d.
func (s *Sentinel) WaitFailover(ctx context.Context, old string, d time.Duration) string {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		if a, err := s.MasterAddr(ctx); err == nil && a != old {
			c := directClient(a)
			info, err := c.Info(ctx, "replication").Result()
			c.Close()
			if err == nil && infoField(info, "role") == "master" {
				return a
			}
		}
		select {
		case <-ctx.Done():
			s.tb.Fatalf("redistest: no failover away from %s within %v", old, d)
			return ""
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *Sentinel) track(c interface{ Close() error }) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients = append(s.clients, c)
}

func (s *Sentinel) close() {
	s.mu.Lock()
	clients := s.clients
	s.clients = nil
	s.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	var wg sync.WaitGroup
	for _, sv := range append(s.servers, s.sentinels...) {
		wg.Go(sv.kill)
	}
	wg.Wait()
}
