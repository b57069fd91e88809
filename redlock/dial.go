package redlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/quorumlock/quorumlock/quorum"
)

// Dial builds one node client per URL and returns a Client over them, as New
// does; each URL is one independent Redlock node. Close closes the clients
// Dial built. Every client is built with ContextTimeoutEnabled, so that a
// node timeout also frees the connection, and dials once per connection
// (DialerRetries 1, unless a redis+sentinel or redis+cluster URL sets
// dialer_retries), so that a node that refuses connections is known at
// once: with go-redis's default of 5 dials 100ms apart, in each of its
// MaxRetries+1 tries, a refused node looked silent for the whole node
// timeout, to Dial and to every request and Close after it.
//
// The URL forms (query parameters are those of go-redis's ParseURL,
// ParseFailoverURL and ParseClusterURL: dial_timeout, pool_size, …):
//
//	redis://[[user]:password@]host[:port][/db]      a master
//	rediss://…                                       the same over TLS
//	unix://[[user]:password@]/path/to/redis.sock     a master on a Unix socket
//	redis+sentinel://[[user]:password@]sentinel[:port][/db]?master_name=NAME[&addr=sentinel2:port…]
//	                                                 a Sentinel-managed master
//	redis+cluster://[[user]:password@]host[:port][?addr=host2:port2…]
//	                                                 a whole Redis Cluster
//	rediss+sentinel://…, rediss+cluster://…          the same over TLS
//
// In a redis+sentinel URL the user and password authenticate to the
// Sentinels; the master's go in the username and password query parameters
// (go-redis's convention). A Sentinel URL needs master_name, and may not ask
// for reads from replicas (replica_only, route_by_latency, route_randomly):
// a lock is written to the master. On a Cluster node a lock key and its fence
// counter share a hash tag, so resources must not contain braces.
//
// TLS URLs verify the server against the system's roots, unless
// WithTLSConfig supplies other roots or a client certificate.
//
// Unlike New, Dial talks to the nodes: in one parallel round, each bounded
// by ctx and the node timeout (see WithNodeTimeout), it sends every node
// PING, then ROLE and INFO server on the same connection, so that a
// configuration error shows at startup rather than at the first Lock. A
// minority of nodes down or unreachable is tolerated, as it is for every
// lock (the clients reconnect when the nodes come back; WithLogger and
// WithHooks see their errors, with Op "dial"); such nodes are not checked.
// A node that refuses connections costs Dial about 0.1s (go-redis's
// retries of the request); one that accepts and never answers, the node
// timeout (or ctx's deadline, if sooner): its error then matches
// context.DeadlineExceeded.
// A node that answers ROLE or INFO with an error reply is not verified, and
// Dial goes on: an ACL user without +role or +info (NOPERM), or a server
// without these commands, such as miniredis. WithHooks and WithLogger see it
// as a node error with Op "dial" and Kind "reply" (a warning in the log).
// A Cluster node gets PING only: its client writes each key to the master
// of the key's slot. Dial fails, and closes what it built, when:
//
//   - an argument is bad: no URLs, a URL that does not parse or has an
//     unknown scheme or option, or an invalid option. So are max_retries or
//     max_redirects below -1 (go-redis would then send no pipelined command
//     and report success), and pool sizes or connection counts above 65,536
//     or buffer sizes above 64 MiB (go-redis allocates pools when it builds
//     a client). The error matches ErrInvalidArgument, names the URL by its
//     index with its password redacted, and no I/O was done;
//   - the nodes are not independent masters: two URLs with the same address
//     (found before any I/O; the database number does not make another
//     server), two nodes that answer with the same run_id (one server
//     reached by two names, such as 127.0.0.1 and localhost, a proxy, or a
//     Sentinel URL and its master's), or a node whose ROLE is not master (a
//     replica refuses writes; a Sentinel holds no keys). One server counted
//     twice is not a majority. The error matches ErrInvalidArgument and
//     names the nodes by index and URL, passwords redacted;
//   - a node refused us for good: wrong credentials (WRONGPASS, NOAUTH), an
//     ACL without PING (NOPERM), a TLS certificate that does not verify, or
//     a TLS handshake the server rejected. The error is joined with a
//     *NodeError per such node, whose Err is the node's reply or the TLS
//     error;
//   - fewer than a majority answered: the error matches ErrNoQuorum and is
//     joined with a *NodeError per failed node.
func Dial(ctx context.Context, urls []string, opts ...Option) (*Client, error) {
	if len(urls) == 0 {
		return nil, invalid("urls: at least one URL is needed")
	}
	tlsCfg := tlsConfig(opts)
	nodes := make([]redis.UniversalClient, 0, len(urls))
	addrs := make([]string, 0, len(urls))
	closeAll := func() {
		for _, n := range nodes {
			n.Close()
		}
	}
	for i, raw := range urls {
		n, addr, err := dialURL(raw, tlsCfg)
		if err != nil {
			closeAll()
			return nil, invalid("urls[%d] (%s): %v", i, redact(raw), err)
		}
		nodes = append(nodes, n)
		addrs = append(addrs, addr)
		if why := nodecheck.DroppedCommands(n); why != "" {
			closeAll()
			return nil, invalid("urls[%d] (%s): %s", i, redact(raw), why)
		}
		if j, why := nodecheck.DuplicateNode(nodes, i); j >= 0 {
			closeAll()
			return nil, invalid("urls[%d] (%s) and urls[%d] (%s) %s: one server counted twice is not a majority", j, redact(urls[j]), i, redact(raw), why)
		}
	}
	c, err := New(nodes, opts...)
	if err != nil {
		closeAll()
		return nil, err
	}
	for i, n := range nodes {
		if addrs[i] != "" {
			c.nodes[i].Addr = addrs[i]
		}
		c.owned = append(c.owned, n)
	}
	if err := c.ping(ctx, urls); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// tlsConfig returns the TLS configuration of the last WithTLSConfig in
// opts, or nil.
func tlsConfig(opts []Option) *tls.Config {
	var cfg *tls.Config
	for _, o := range opts {
		if t, ok := o.(tlsOption); ok && t.cfg != nil {
			cfg = t.cfg
		}
	}
	return cfg
}

// tlsOption is read by Dial; it configures no lock.
type tlsOption struct{ cfg *tls.Config }

func (tlsOption) apply(*config) {}

// ping sends PING, ROLE and INFO server to every node, the nodes in
// parallel (see Dial for what fails). urls name the nodes in errors.
func (c *Client) ping(ctx context.Context, urls []string) error {
	n := len(c.nodes)
	probes := make([]nodecheck.ServerInfo, n)
	// A fan-out that waits for every node: the zero errgroup.Group, which
	// cancels nothing when one fails (each probe writes its own slot).
	var g errgroup.Group
	for i := range c.nodes {
		g.Go(func() error {
			pctx, cancel := nodeContext(ctx, c.cfg.nodeTimeout)
			defer cancel()
			start := time.Now()
			probes[i] = nodecheck.ProbeNode(pctx, c.nodes[i].C)
			probes[i].Err = silentUntil(ctx, pctx, start, probes[i].Err)
			return nil
		})
	}
	_ = g.Wait()
	var refused, failed []error
	obs := c.cfg.obs
	for i, p := range probes {
		if p.Unverified != nil && obs != nil {
			obs.NodeError(ctx, NodeErrorInfo{Op: "dial", Node: i, Addr: c.nodes[i].Addr, Kind: errorKind(p.Unverified), Err: p.Unverified})
		}
		if p.Err == nil {
			continue
		}
		if obs != nil {
			obs.NodeError(ctx, NodeErrorInfo{Op: "dial", Node: i, Addr: c.nodes[i].Addr, Kind: errorKind(p.Err), Err: p.Err})
		}
		ne := &NodeError{Node: i, Addr: c.nodes[i].Addr, Err: p.Err}
		failed = append(failed, ne)
		if permanent(p.Err) {
			refused = append(refused, ne)
		}
	}
	if err := nodecheck.UnsafeNodes(probes, func(i int) string { return redact(urls[i]) }, invalid); err != nil {
		return err
	}
	if len(refused) > 0 {
		// Not "refused the connection": that is what a closed port says.
		head := fmt.Errorf("redlock: dial: %d of %d nodes rejected this client (its credentials, ACL or TLS); check those settings of their URLs", len(refused), n)
		return errors.Join(append([]error{head}, refused...)...)
	}
	if len(failed) == n && errors.Is(ctx.Err(), context.Canceled) {
		// The caller cancelled ctx before any node answered: not an
		// outage. (Silent nodes until a deadline are: ErrNoQuorum below.)
		head := &classed{msg: "redlock: dial: ctx cancelled before the nodes answered PING", class: []error{context.Canceled}}
		return errors.Join(append([]error{head}, failed...)...)
	}
	if n-len(failed) < c.quorum {
		head := fmt.Errorf("%w: %d of %d nodes answered PING, %d needed", ErrNoQuorum, n-len(failed), n, c.quorum)
		return errors.Join(append([]error{head}, failed...)...)
	}
	return nil
}

// silentUntil returns err, the error of a probe started at start on pctx
// (ctx bounded by the node timeout), as a *quorum.TimeoutError, which
// matches context.DeadlineExceeded, when it is a timeout and pctx's
// deadline has passed: a node that did not answer in time, whichever of
// go-redis's two ways of saying so came first. go-redis dials and
// handshakes in a goroutine of its own and returns either ctx's error or
// the socket's "i/o timeout", both armed for the same instant; under load
// the socket's came first (issue 44), and an error that matched the
// deadline only sometimes was the result.
func silentUntil(ctx, pctx context.Context, start time.Time, err error) error {
	dl, ok := pctx.Deadline()
	if err == nil || !ok || time.Now().Before(dl) || !nodecheck.IsTimeout(err) {
		return err
	}
	cdl, caller := ctx.Deadline()
	return &quorum.TimeoutError{After: dl.Sub(start), Caller: caller && !cdl.After(dl)}
}

// permanent reports whether a node's answer to PING is a configuration
// error, which waiting will not fix: rejected credentials or permissions, a
// server certificate that does not verify, or a TLS alert from the server
// (such as "certificate required" without a client certificate).
func permanent(err error) bool {
	if nodecheck.AuthRefused(err) || redis.HasErrorPrefix(err, "NOPERM") {
		return true
	}
	var (
		verify *tls.CertificateVerificationError
		op     *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &op) && op.Op == "remote error"
}

// nodeContext bounds one request to one node by d, unless ctx ends sooner.
func nodeContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
