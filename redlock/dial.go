package redlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Dial builds one node client per URL and returns a Client over them, as New
// does; each URL is one independent Redlock node. Close closes the clients
// Dial built. Every client is built with ContextTimeoutEnabled, so that a
// node timeout also frees the connection.
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
// Unlike New, Dial talks to the nodes: it sends PING to every node in
// parallel, each bounded by ctx and the node timeout (see WithNodeTimeout),
// so that a configuration error shows at startup rather than at the first
// Lock. A minority of nodes down or unreachable is tolerated, as it is for
// every lock (the clients reconnect when the nodes come back; WithLogger and
// WithHooks see their errors, with Op "dial"). Dial fails, and closes what it
// built, when:
//
//   - an argument is bad: no URLs, a URL that does not parse or has an
//     unknown scheme or option, or an invalid option. The error matches
//     ErrInvalidArgument, names the URL by its index with its password
//     redacted, and no I/O was done;
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
	var tlsCfg *tls.Config
	for _, o := range opts {
		if t, ok := o.(tlsOption); ok && t.cfg != nil {
			tlsCfg = t.cfg
		}
	}
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
	}
	c, err := New(nodes, opts...)
	if err != nil {
		closeAll()
		return nil, err
	}
	for i, n := range nodes {
		if addrs[i] != "" {
			c.nodes[i].addr = addrs[i]
		}
		c.owned = append(c.owned, n)
	}
	if err := c.ping(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// WithTLSConfig sets the TLS configuration of the clients Dial builds for
// TLS URLs (rediss, rediss+sentinel, rediss+cluster): the roots to trust
// (RootCAs) and a client certificate for mutual TLS (Certificates). Dial uses
// a clone, with ServerName set to the URL's host when empty, and
// InsecureSkipVerify when the URL says skip_verify=true. URLs without TLS
// ignore it. It has no effect on New or on a single call, which build no
// clients. By default TLS URLs trust the system's roots.
func WithTLSConfig(cfg *tls.Config) Option { return tlsOption{cfg} }

// tlsOption is read by Dial; it configures no lock.
type tlsOption struct{ cfg *tls.Config }

func (tlsOption) apply(*config) {}

// dialURL builds the client for one URL, and returns the address to report
// in node errors ("" to keep the client's own). It does no I/O.
func dialURL(raw string, tlsCfg *tls.Config) (n redis.UniversalClient, addr string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		// A *url.Error quotes the whole URL, password included.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, "", err
	}
	base, kind, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" && !(base == "unix" && kind == "") {
		return nil, "", fmt.Errorf("unknown scheme %q: want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", u.Scheme)
	}
	plain := *u
	plain.Scheme = base
	// go-redis constructors panic on a few absurd option values (a pool size
	// that overflows int32); an argument error is what Dial promises.
	defer func() {
		if r := recover(); r != nil {
			n, addr, err = nil, "", fmt.Errorf("rejected by go-redis: %v", r)
		}
	}()
	switch kind {
	case "":
		o, err := redis.ParseURL(plain.String())
		if err != nil {
			return nil, "", err
		}
		o.ContextTimeoutEnabled = true
		o.TLSConfig = withTLS(o.TLSConfig, tlsCfg, u)
		return redis.NewClient(o), "", nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain.String())
		if err != nil {
			return nil, "", err
		}
		switch {
		case o.MasterName == "":
			return nil, "", errors.New("a sentinel URL needs the master_name parameter")
		case o.ReplicaOnly, o.RouteByLatency, o.RouteRandomly, o.UseDisconnectedReplicas:
			return nil, "", errors.New("replica_only, route_by_latency, route_randomly and use_disconnected_replicas are not allowed: a lock is written to the master")
		}
		o.ContextTimeoutEnabled = true
		o.TLSConfig = withTLS(o.TLSConfig, tlsCfg, u)
		return redis.NewFailoverClient(o), "sentinel(" + o.MasterName + "@" + strings.Join(o.SentinelAddrs, ",") + ")", nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return nil, "", err
		}
		o.ContextTimeoutEnabled = true
		o.TLSConfig = withTLS(o.TLSConfig, tlsCfg, u)
		return redis.NewClusterClient(o), "", nil
	}
	return nil, "", fmt.Errorf("unknown scheme %q: want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", u.Scheme)
}

// withTLS returns the TLS config for a URL: parsed is what go-redis made of
// it (nil without TLS), user is WithTLSConfig's (nil if not given).
func withTLS(parsed, user *tls.Config, u *url.URL) *tls.Config {
	if parsed == nil || user == nil {
		return parsed
	}
	c := user.Clone()
	if c.ServerName == "" {
		c.ServerName = u.Hostname()
	}
	if parsed.InsecureSkipVerify {
		c.InsecureSkipVerify = true
	}
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// redact returns raw with its passwords replaced by "xxxxx": the user-info
// one, and the password and sentinel_password query parameters.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "unparsable URL"
	}
	q := u.Query()
	for _, k := range []string{"password", "sentinel_password"} {
		if q.Has(k) {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.Redacted()
}

// ping sends PING to every node in parallel (see Dial for what fails).
func (c *Client) ping(ctx context.Context) error {
	n := len(c.nodes)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range c.nodes {
		wg.Go(func() {
			pctx, cancel := nodeContext(ctx, c.cfg.timeout())
			defer cancel()
			if err := c.nodes[i].c.Ping(pctx).Err(); err != nil {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	var refused, failed []error
	for i, err := range errs {
		if err == nil {
			continue
		}
		if obs := c.cfg.obs; obs != nil {
			obs.NodeError(ctx, NodeErrorInfo{Op: "dial", Node: i, Addr: c.nodes[i].addr, Kind: errorKind(err), Err: err})
		}
		ne := &NodeError{Node: i, Addr: c.nodes[i].addr, Err: err}
		failed = append(failed, ne)
		if permanent(err) {
			refused = append(refused, ne)
		}
	}
	switch {
	case len(refused) > 0:
		head := fmt.Errorf("redlock: dial: %d of %d nodes refused the connection; check the credentials, ACL and TLS settings of their URLs", len(refused), n)
		return errors.Join(append([]error{head}, refused...)...)
	case n-len(failed) < c.quorum:
		head := fmt.Errorf("%w: %d of %d nodes answered PING, %d needed", ErrNoQuorum, n-len(failed), n, c.quorum)
		return errors.Join(append([]error{head}, failed...)...)
	}
	return nil
}

// permanent reports whether a node's answer to PING is a configuration
// error, which waiting will not fix: rejected credentials or permissions, a
// server certificate that does not verify, or a TLS alert from the server
// (such as "certificate required" without a client certificate).
func permanent(err error) bool {
	for _, prefix := range []string{"NOAUTH", "WRONGPASS", "NOPERM"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
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
