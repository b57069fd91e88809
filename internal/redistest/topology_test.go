package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestSentinel_failoverAfterKill(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	ctx := t.Context()
	fc := s.Client()
	if err := fc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set through the failover client = %v", err)
	}
	s.WaitReplicated(ctx, 10*time.Second) // returns once acknowledged: at 1s it missed in the full suite (load 13-15)
	old := s.KillMaster(ctx)
	start := time.Now()
	now := s.WaitFailover(ctx, old, 20*time.Second)
	t.Logf("failover from %s to %s took %v", old, now, time.Since(start).Round(time.Millisecond))
	if now != s.ServerAddr(1) {
		t.Errorf("new master = %s; want the replica %s", now, s.ServerAddr(1))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := fc.Get(ctx, "k").Result()
		if err == nil {
			if v != "v" {
				t.Errorf("Get after failover = %q; want %q (it was replicated)", v, "v")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get after failover = %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRedisCluster_routesBySlot(t *testing.T) {
	t.Parallel()
	c := StartRedisCluster(t, 3)
	cl := c.Client()
	ctx := t.Context()
	seen := map[string]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := cl.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("Set(%q) = %v", k, err)
		}
		m, err := cl.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		seen[m.Options().Addr] = true
	}
	if len(seen) < 2 {
		t.Errorf("8 keys landed on %d masters; want the slots spread over 3", len(seen))
	}
}

func TestStartTLS_requiresClientCertificate(t *testing.T) {
	t.Parallel()
	pki := NewPKI(t)
	_, addr := StartTLS(t, pki)
	ctx := t.Context()

	good := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: pki.ClientConfig(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer good.Close()
	if err := good.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping over TLS with the client certificate = %v", err)
	}

	noCert := pki.ClientConfig()
	noCert.Certificates = nil
	bad := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: noCert, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer bad.Close()
	if err := bad.Ping(ctx).Err(); err == nil {
		t.Errorf("Ping over TLS without a client certificate = nil; want an error")
	}

	untrusting := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer untrusting.Close()
	var uae x509.UnknownAuthorityError
	if err := untrusting.Ping(ctx).Err(); !errors.As(err, &uae) {
		t.Errorf("Ping over TLS trusting only the system roots = %v; want an unknown authority error", err)
	}
}
