package redlock

import (
	"context"
	"errors"
	"math"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/quorumlock/quorumlock/quorum"
)

// Fuzz targets: arbitrary resource names and option values, and arbitrary
// Dial URLs, must never panic and must fail only with the library's typed
// errors. `go test` runs the seeds below and those in testdata/fuzz;
// explore with e.g.
//
//	go test ./redlock -run '^$' -fuzz '^FuzzClient$' -fuzztime 60s
//	go test ./redlock -run '^$' -fuzz '^FuzzDial$' -fuzztime 60s

// typedErr reports whether err is nil or matches one of want, or a ctx
// error (a call may end with the caller's ctx).
func typedErr(err error, want ...error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	for _, w := range want {
		if errors.Is(err, w) {
			return true
		}
	}
	return false
}

// fuzzNodes starts n miniredis nodes for the whole fuzz target, and returns
// their clients and a function that empties them between inputs.
func fuzzNodes(f *testing.F, n int) ([]redis.UniversalClient, func()) {
	f.Helper()
	ms, cs := miniNodes(f, n)
	return cs, func() {
		for _, m := range ms {
			m.FlushAll()
		}
	}
}

// Bits of FuzzClient's flags.
const (
	fuzzPerCall    = 1 << iota // options go to each call, not to New
	fuzzNoRenew                // WithAutoRenew(false)
	fuzzFencing                // WithFencing(true)
	fuzzNoWakeUp               // WithWakeUp(false)
	fuzzPrefix                 // WithKeyPrefix(prefix)
	fuzzNoTimeout              // leave the node timeout derived
	fuzzNoInterval             // leave the renew interval derived
)

func FuzzClient(f *testing.F) {
	ms, sec := int64(time.Millisecond), int64(time.Second)
	type seed struct {
		resource               string
		ttl, timeout, interval int64
		retryMin, retryMax     int64
		count                  int
		drift                  float64
		flags                  uint8
		prefix                 string
	}
	derived := uint8(fuzzNoTimeout | fuzzNoInterval)
	for _, s := range []seed{
		{"invoice:1234", 30 * sec, 0, 0, 50 * ms, 250 * ms, 0, 0.01, derived, ""},
		{"invoice:1234", 30 * sec, 0, 0, 50 * ms, 250 * ms, 0, 0.01, derived | fuzzPerCall, ""},
		{"r", 3 * sec, 100 * ms, sec, ms, 2 * ms, 2, 0.01, fuzzFencing, "app:"},
		{"r", 300 * ms, 20 * ms, 100 * ms, 0, 0, 1, 0, fuzzNoRenew | fuzzNoWakeUp, ""},
		{"", 30 * sec, 0, 0, 0, 0, 0, 0.01, derived, ""},
		{"x:fence", 30 * sec, 0, 0, 0, 0, 0, 0.01, derived, ""},
		{"a{b}", 30 * sec, 0, 0, 0, 0, 0, 0.01, derived, ""},
		{"\x00\xff\n ✓", 30 * sec, 0, 0, 0, 0, 0, 0.01, derived, "\x00"},
		{strings.Repeat("long", 4096), 30 * sec, 0, 0, 0, 0, 0, 0.01, derived, ""},
		{"r", 1, 0, 0, 0, 0, 1, 0, derived, ""},
		{"r", 3 * ms, 1, 2 * ms, 0, 0, 1, 0, 0, ""},
		{"r", math.MaxInt64, 0, 0, 0, 0, 1, 0.01, derived, ""},
		{"r", math.MaxInt64, 0, 0, 0, 0, 1, 0.999999, derived, ""},
		{"r", math.MaxInt64, 0, 0, 0, 0, 1, 0.9999999999999999, derived, ""},
		{"r", math.MaxInt64, 0, 0, 0, 0, 1, 0.9999999999999999, derived | fuzzPerCall, ""},
		{"r", math.MaxInt64, math.MaxInt64 - 2, math.MaxInt64 - 1, 0, 0, 1, 0, 0, ""},
		{"r", math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt32, -1, 0, ""},
		{"r", 30 * sec, 0, 0, 0, math.MaxInt64, 2, 0.01, derived, ""},
		{"r", 30 * sec, 0, 0, 0, 0, math.MaxInt, 0.01, derived | fuzzPerCall | fuzzPrefix, "p:"},
		{"r", 30 * sec, 0, 0, 0, 0, 1, math.NaN(), derived, ""},
		{"r", 30 * sec, 0, 0, 0, 0, 1, math.Inf(1), derived, ""},
		{"r", 30 * sec, 0, 0, 0, 0, 1, math.Copysign(0, -1), derived, ""},
		{"r", 30 * sec, -1, -1, 0, 0, 1, 0.01, 0, ""},
	} {
		f.Add(s.resource, s.ttl, s.timeout, s.interval, s.retryMin, s.retryMax, s.count, s.drift, s.flags, s.prefix)
	}
	nodes, flush := fuzzNodes(f, 3)

	f.Fuzz(func(t *testing.T, resource string, ttl, timeout, interval, retryMin, retryMax int64, count int, drift float64, flags uint8, prefix string) {
		flush()
		opts := []Option{
			WithTTL(time.Duration(ttl)),
			WithRetryCount(count),
			WithRetryDelay(time.Duration(retryMin), time.Duration(retryMax)),
			WithDriftFactor(drift),
			WithAutoRenew(flags&fuzzNoRenew == 0),
			WithFencing(flags&fuzzFencing != 0),
			WithWakeUp(flags&fuzzNoWakeUp == 0),
		}
		if flags&fuzzNoTimeout == 0 {
			opts = append(opts, WithNodeTimeout(time.Duration(timeout)))
		}
		if flags&fuzzNoInterval == 0 {
			opts = append(opts, WithRenewInterval(time.Duration(interval)))
		}
		var newOpts, callOpts []Option
		if flags&fuzzPerCall != 0 {
			callOpts = opts
		} else {
			newOpts = opts
		}
		if flags&fuzzPrefix != 0 {
			// Valid for New only; per call it must be refused.
			if flags&fuzzPerCall != 0 {
				callOpts = append(callOpts, WithKeyPrefix(prefix))
			} else {
				newOpts = append(newOpts, WithKeyPrefix(prefix))
			}
		}

		c, err := New(nodes, newOpts...)
		if !typedErr(err, ErrInvalidArgument) || (err == nil) == (c == nil) {
			t.Fatalf("New = %v, %v; want a Client or ErrInvalidArgument", c, err)
		}
		if err != nil {
			return
		}
		defer func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
		}()
		// A configuration that validates leaves a lease some validity.
		if cfg, err := buildConfig(c.cfg, callOpts, true); err == nil && c.checkResource(resource) == nil {
			if v := quorum.Validity(cfg.ttl, 0, cfg.drift); v <= 0 {
				t.Errorf("TTL %v, drift %v validate, but leave a validity of %v", cfg.ttl, cfg.drift, v)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()

		// checkLock checks a call's result: a typed error, or a lock whose
		// validity does not exceed the TTL it asked for.
		checkLock := func(call string, start time.Time, l *Lock, err error) {
			t.Helper()
			if !typedErr(err, ErrInvalidArgument, ErrNotObtained, ErrNoQuorum) {
				t.Errorf("%s(%q) = %v; want a typed error", call, resource, err)
			}
			if (err == nil) == (l == nil) {
				t.Fatalf("%s(%q) = %v, %v; want a lock or an error", call, resource, l, err)
			}
			if l == nil {
				return
			}
			if l.Resource() != resource || l.Token() == "" {
				t.Errorf("%s: Resource %q, Token %q; want %q and a token", call, l.Resource(), l.Token(), resource)
			}
			// A handed-over lock counts its validity from its first queued
			// attempt, which may come after start (step 9): a release of
			// the previous call's lock that lands after this call began
			// (the Client finishes it, step 4) can hand it the key. Never
			// more than a TTL from now holds for every path.
			if cfg, _ := buildConfig(c.cfg, callOpts, true); l.ValidUntil().After(time.Now().Add(cfg.ttl)) {
				t.Errorf("%s: ValidUntil %v after now + TTL %v", call, time.Until(l.ValidUntil()), cfg.ttl)
			}
			if err := l.Unlock(context.Background()); !typedErr(err, ErrNotHeld, ErrLockLost, ErrNoQuorum) {
				t.Errorf("%s: Unlock = %v; want a typed error", call, err)
			}
		}

		start := time.Now()
		l, err := c.TryLock(ctx, resource, callOpts...)
		checkLock("TryLock", start, l, err)
		start = time.Now()
		l, err = c.Lock(ctx, resource, callOpts...)
		checkLock("Lock", start, l, err)

		called := false
		err = c.Do(ctx, resource, func(context.Context) error { called = true; return nil }, callOpts...)
		if !typedErr(err, ErrInvalidArgument, ErrNotObtained, ErrNoQuorum, ErrLockLost, ErrNotHeld) {
			t.Errorf("Do(%q) = %v; want a typed error", resource, err)
		}
		if err == nil && !called {
			t.Errorf("Do(%q) = nil without calling fn", resource)
		}

		ok, err := c.IsLocked(ctx, resource)
		if !typedErr(err, ErrInvalidArgument, ErrNoQuorum) || (ok && err != nil) {
			t.Errorf("IsLocked(%q) = %v, %v; want a typed error", resource, ok, err)
		}
	})
}

// fuzzHost stands for a closed port of 127.0.0.1 in FuzzDial's inputs.
const fuzzHost = "HOST"

func FuzzDial(f *testing.F) {
	for _, s := range []string{
		"redis://HOST",
		"redis://HOST/0?dial_timeout=1s&pool_size=4",
		"redis://user:hunter22@HOST/1",
		"redis://:hunter22@HOST?password=hunter33",
		"rediss://HOST?skip_verify=true",
		"unix:///tmp/none.sock?db=1",
		"unix+cluster:///tmp/none.sock",
		"redis+sentinel://HOST?master_name=m&addr=HOST",
		"redis+sentinel://u:hunter22@HOST?master_name=m&sentinel_password=hunter44",
		"redis+sentinel://HOST?master_name=m&route_randomly=true",
		"redis+sentinel://HOST?master_name=m&replica_only=true",
		"redis+cluster://HOST?addr=HOST&read_only=true",
		"rediss+cluster://HOST",
		"redis+ring://HOST",
		"http://HOST",
		"redis://HOST?pool_size=99999999999",
		"redis://HOST?pool_size=100000000",
		"redis+sentinel://HOST?master_name=m&pipeline_pool_size=100000000",
		"redis://HOST?pipeline_write_buffer_size=2000000000&max_concurrent_dials=65537",
		"redis://HOST?pool_size=65536&max_retries=-1",
		"redis://HOST?max_retries=-5&min_idle_conns=-1",
		"redis://HOST/99999999999999999999",
		"redis://HOST?protocol=9",
		"redis://[::1",
		"redis://h:port",
		"redis://user:se cret@HOST",
		"redis://%zz@HOST",
		"",
		"redis://",
		":",
	} {
		f.Add(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	f.Fuzz(func(t *testing.T, in string) {
		raw := strings.ReplaceAll(in, fuzzHost, dead)

		// Parsing alone: a client or an error, never a panic, no I/O.
		n, _, perr := dialURL(raw, nil)
		local := false
		if perr == nil {
			local = onlyAt(n, dead, raw)
			n.Close()
		}
		r := redact(raw)
		for _, p := range passwords(raw) {
			if strings.Contains(r, p) {
				t.Errorf("redact(%q) = %q; it shows the password", raw, r)
			}
		}

		// Dial itself, where it cannot reach anything but the closed port:
		// an invalid URL fails before any I/O, a valid one with no node.
		if perr != nil || local {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			c, err := Dial(ctx, []string{raw})
			if c != nil {
				c.Close()
				t.Fatalf("Dial(%q) = a Client; nothing listens there", raw)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("Dial(%q) took %v; want it bounded by its 100ms ctx", raw, d)
			}
			switch {
			case perr != nil && !errors.Is(err, ErrInvalidArgument):
				t.Errorf("Dial(%q) = %v; want ErrInvalidArgument (dialURL: %v)", raw, err, perr)
			case perr == nil && !errors.Is(err, ErrNoQuorum) && !errors.Is(err, ErrInvalidArgument):
				t.Errorf("Dial(%q) = %v; want ErrNoQuorum", raw, err)
			}
			for _, p := range passwords(raw) {
				if err != nil && strings.Contains(err.Error(), p) {
					t.Errorf("Dial(%q) = %q; it shows the password", raw, err)
				}
			}
		}
	})
}

// onlyAt reports whether n, built by dialURL from raw, can connect only to
// addr over TCP: FuzzDial must not resolve or reach arbitrary hosts.
func onlyAt(n redis.UniversalClient, addr, raw string) bool {
	switch c := n.(type) {
	case *redis.ClusterClient:
		for _, a := range c.Options().Addrs {
			if a != addr {
				return false
			}
		}
		return len(c.Options().Addrs) > 0
	case *redis.Client:
		o := c.Options()
		if o.Addr == nodecheck.FailoverAddr {
			// The Sentinels: the URL's host and its addr parameters.
			u, err := url.Parse(raw)
			if err != nil || u.Host != addr {
				return false
			}
			for _, a := range u.Query()["addr"] {
				if a != addr {
					return false
				}
			}
			return true
		}
		return o.Network == "tcp" && o.Addr == addr
	}
	return false
}

// passwords returns the passwords in raw distinctive enough that finding
// one in an error means it leaked: at least 8 bytes with a letter and a
// digit, found once in raw.
func passwords(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	cands := []string{u.Query().Get("password"), u.Query().Get("sentinel_password")}
	if p, ok := u.User.Password(); ok {
		cands = append(cands, p)
	}
	for _, p := range cands {
		if len(p) >= 8 && strings.IndexFunc(p, unicode.IsLetter) >= 0 && strings.IndexFunc(p, unicode.IsDigit) >= 0 &&
			strings.Count(raw, p) == 1 {
			out = append(out, p)
		}
	}
	return out
}
