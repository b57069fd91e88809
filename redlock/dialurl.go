// How Dial reads its URLs: one node client per URL, its TLS, and the
// bounds on the sizes a URL may ask for.

package redlock

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// dialURL builds the client for one URL, and returns the address to report
// in node errors ("" to keep the client's own). It does no I/O.
func dialURL(raw string, tlsCfg *tls.Config) (n redis.UniversalClient, addr string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		// A *url.Error quotes the whole URL, password included.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, "", withHint(err, raw)
	}
	base, kind, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" && !(base == "unix" && kind == "") {
		return nil, "", withHint(fmt.Errorf("unknown scheme %q: want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", u.Scheme), raw)
	}
	if err := checkSizes(u.Query()); err != nil {
		return nil, "", err
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
		o.DialerRetries = oneDial(o.DialerRetries)
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
		o.DialerRetries = oneDial(o.DialerRetries)
		o.TLSConfig = withTLS(o.TLSConfig, tlsCfg, u)
		return redis.NewFailoverClient(o), "sentinel(" + o.MasterName + "@" + strings.Join(o.SentinelAddrs, ",") + ")", nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return nil, "", err
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = oneDial(o.DialerRetries)
		o.TLSConfig = withTLS(o.TLSConfig, tlsCfg, u)
		return redis.NewClusterClient(o), "", nil
	}
	return nil, "", fmt.Errorf("unknown scheme %q: want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", u.Scheme)
}

// oneDial returns the dial attempts per connection of a client Dial builds:
// the URL's dialer_retries when it sets one, else 1. go-redis's default (5
// attempts 100ms apart, inside each of its MaxRetries+1 tries) made a
// request to a node that refuses connections wait out its whole node
// timeout and report "context deadline exceeded" instead of the refusal
// (issue 44). The Client's own health probe brings a node back.
func oneDial(fromURL int) int {
	if fromURL > 0 {
		return fromURL
	}
	return 1
}

// sizeParams are the URL parameters bounded by checkSizes, with their bound.
var sizeParams = []struct {
	name  string
	limit int
}{
	{"pool_size", maxURLConns},
	{"pipeline_pool_size", maxURLConns},
	{"min_idle_conns", maxURLConns},
	{"max_idle_conns", maxURLConns},
	{"max_active_conns", maxURLConns},
	{"max_concurrent_dials", maxURLConns},
	{"read_buffer_size", maxURLBuffer},
	{"write_buffer_size", maxURLBuffer},
	{"pipeline_read_buffer_size", maxURLBuffer},
	{"pipeline_write_buffer_size", maxURLBuffer},
}

// checkSizes refuses a URL whose sizes would make go-redis allocate without
// bound. Values that are not integers are left to go-redis's parser.
func checkSizes(q url.Values) error {
	for _, p := range sizeParams {
		for _, v := range q[p.name] {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > int64(p.limit) {
				return fmt.Errorf("%s %s is above %d", p.name, v, p.limit)
			}
		}
	}
	return nil
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

// withHint adds "did you mean redis://host:port" to the error of a URL
// given as a bare host:port (url.Parse reads "127.0.0.1:7601" as a path
// with a colon, and "localhost:7601" as the scheme "localhost").
func withHint(err error, raw string) error {
	if strings.Contains(raw, "://") || strings.ContainsAny(raw, "/@?") {
		return err
	}
	host, port, splitErr := net.SplitHostPort(raw)
	if splitErr != nil || port == "" {
		return err
	}
	if _, convErr := strconv.Atoi(port); convErr != nil {
		return err
	}
	return fmt.Errorf("%w (did you mean redis://%s?)", err, net.JoinHostPort(host, port))
}

// Bounds of the URL parameters by which go-redis sizes what it allocates.
const (
	// maxURLConns bounds pool sizes and connection counts: go-redis
	// allocates a pool's slots when it builds the client (pool_size=1e6
	// took 540MB; 1e8 was a fatal out-of-memory error, found fuzzing Dial).
	// One host cannot open more TCP connections to one address anyway: one
	// per local port.
	maxURLConns = 1 << 16
	// maxURLBuffer bounds the buffers go-redis allocates per connection.
	maxURLBuffer = 64 << 20
)
