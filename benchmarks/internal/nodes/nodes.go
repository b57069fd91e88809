// Package nodes makes the Redis node clients the benchmarks use, all with the
// same settings for every library: embedded nodes (local redis-server
// processes, or in-process miniredis when redis-server is not on PATH) or the
// user's own nodes given as redis:// URLs.
package nodes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// Options returns the client settings every library gets for the node at
// addr: go-redis defaults plus ContextTimeoutEnabled (so that a node timeout
// frees the connection, as quorumlock's README asks) and a handshake of
// HELLO alone (no CLIENT SETINFO, no maintenance notifications, which Redis
// 7.0 rejects). These only change how a connection is opened, not a
// request.
func Options(addr string) *redis.Options {
	o := &redis.Options{Addr: addr}
	tune(o)
	return o
}

func tune(o *redis.Options) {
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// ParseURLs parses a comma-separated list of redis:// or rediss:// URLs
// (user, password, database and TLS as go-redis's ParseURL reads them) into
// client options with the common settings.
func ParseURLs(list string) ([]*redis.Options, error) {
	var out []*redis.Options
	for _, u := range strings.Split(list, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.Contains(u, "://") {
			u = "redis://" + u
		}
		o, err := redis.ParseURL(u)
		if err != nil {
			// go-redis quotes the URL in its error: hide the password there too.
			return nil, fmt.Errorf("node %q: %s", redact(u), strings.ReplaceAll(err.Error(), u, redact(u)))
		}
		tune(o)
		out = append(out, o)
	}
	if len(out) == 0 {
		return nil, errors.New("no node URL given")
	}
	return out, nil
}

// redact hides a password in a URL for error messages.
func redact(u string) string {
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 {
		return u
	}
	return u[:scheme+3] + "***" + u[at:]
}

// Kind is how embedded nodes run.
type Kind string

// The kinds of embedded nodes.
const (
	Auto        Kind = "auto"         // RedisServer when redis-server is on PATH, else Miniredis
	RedisServer Kind = "redis-server" // local redis-server processes on 127.0.0.1
	Miniredis   Kind = "miniredis"    // in-process miniredis with ClockTTL(true)
)

// Embedded is a set of nodes this process started.
type Embedded struct {
	Kind  Kind
	Addrs []string

	cluster *redistest.Cluster
	minis   []*miniredis.Miniredis
}

// StartEmbedded starts n nodes of kind k.
func StartEmbedded(n int, k Kind) (*Embedded, error) {
	if k == Auto {
		k = Miniredis
		if redistest.Available() {
			k = RedisServer
		}
	}
	e := &Embedded{Kind: k}
	switch k {
	case RedisServer:
		c, err := redistest.StartCluster(n)
		if err != nil {
			return nil, err
		}
		e.cluster = c
		for i := range n {
			// The server itself, not redistest's proxy: no hop on the way.
			e.Addrs = append(e.Addrs, c.ServerAddr(i))
		}
	case Miniredis:
		for range n {
			m := miniredis.NewMiniRedis()
			// TTLs run in real time, as on a real server; by default
			// miniredis keys never expire unless FastForward is called.
			m.ClockTTL(true)
			if err := m.Start(); err != nil {
				e.Close()
				return nil, err
			}
			e.minis = append(e.minis, m)
			e.Addrs = append(e.Addrs, m.Addr())
		}
	default:
		return nil, fmt.Errorf("unknown node kind %q (want auto, redis-server or miniredis)", k)
	}
	return e, nil
}

// Faults returns the fault controls of embedded redis-server nodes, or nil
// for miniredis nodes (which cannot be paused).
func (e *Embedded) Faults() Faults {
	if e.cluster == nil {
		return nil
	}
	return e.cluster
}

// Faults pauses (SIGSTOP), resumes, kills and restarts node i. The node
// keeps its address across Restart unless its port was taken meanwhile.
type Faults interface {
	Pause(i int)
	Resume(i int)
	Kill(i int)
	Restart(i int)
	Err() error
}

// Close stops every node it started. It is safe to call more than once.
func (e *Embedded) Close() error {
	var err error
	if e.cluster != nil {
		err = e.cluster.Close()
	}
	for _, m := range e.minis {
		m.Close()
	}
	e.minis = nil
	return err
}

// Clients opens one client per options value.
func Clients(opts []*redis.Options) []redis.UniversalClient {
	out := make([]redis.UniversalClient, len(opts))
	for i, o := range opts {
		out[i] = redis.NewClient(o)
	}
	return out
}

// CloseAll closes clients.
func CloseAll(clients []redis.UniversalClient) error {
	var errs []error
	for _, c := range clients {
		if err := c.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CmdCost is what one command cost a node, or a sum of them: the calls and
// the time spent inside the command (INFO commandstats' usec, in µs; a
// script's time includes the commands it calls, which are also counted
// under their own names).
type CmdCost struct {
	Calls float64 `json:"calls"`
	Usec  float64 `json:"usec"`
}

// CommandStats reads INFO commandstats of every node and sums each
// command's calls and usec over the nodes ("pubsub|numsub" for a
// subcommand). It fails when a node does not answer or has no such
// section (miniredis).
func CommandStats(ctx context.Context, ns []redis.UniversalClient) (map[string]CmdCost, error) {
	total := map[string]CmdCost{}
	for i, n := range ns {
		info, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
		if !strings.Contains(info, "cmdstat_") {
			return nil, fmt.Errorf("node %d: no INFO commandstats", i)
		}
		for name, c := range ParseCommandStats(info) {
			t := total[name]
			t.Calls += c.Calls
			t.Usec += c.Usec
			total[name] = t
		}
	}
	return total, nil
}

// ParseCommandStats reads the lines "cmdstat_get:calls=3,usec=5,…" of INFO
// commandstats into calls and usec per command.
func ParseCommandStats(info string) map[string]CmdCost {
	out := map[string]CmdCost{}
	for line := range strings.Lines(info) {
		name, rest, _ := strings.Cut(strings.TrimSpace(line), ":")
		name, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var c CmdCost
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				c.Calls = f
			case "usec":
				c.Usec = f
			}
		}
		out[name] = c
	}
	return out
}

// CPU sums used_cpu_user and used_cpu_sys of INFO cpu over the nodes, in
// µs: the CPU time the server processes have used, network I/O included.
func CPU(ctx context.Context, ns []redis.UniversalClient) (float64, error) {
	total := 0.0
	for i, n := range ns {
		info, err := n.Info(ctx, "cpu").Result()
		if err != nil {
			return 0, fmt.Errorf("node %d: %w", i, err)
		}
		if !strings.Contains(info, "used_cpu_user:") {
			return 0, fmt.Errorf("node %d: no used_cpu_user in INFO cpu", i)
		}
		for line := range strings.Lines(info) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_user" || k == "used_cpu_sys" {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("node %d: %s: %w", i, k, err)
				}
				total += f * 1e6
			}
		}
	}
	return total, nil
}
