package nodes

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseURLs(t *testing.T) {
	t.Parallel()
	got, err := ParseURLs("redis://:secret@10.0.0.1:6379/2, 10.0.0.2:6380,rediss://u:p@h:6381")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("ParseURLs gave %d nodes; want 3", len(got))
	}
	if o := got[0]; o.Addr != "10.0.0.1:6379" || o.Password != "secret" || o.DB != 2 || !o.ContextTimeoutEnabled {
		t.Errorf("node 0 = addr %q, password %q, db %d, ContextTimeoutEnabled %v; want 10.0.0.1:6379, secret, 2, true", o.Addr, o.Password, o.DB, o.ContextTimeoutEnabled)
	}
	if o := got[1]; o.Addr != "10.0.0.2:6380" {
		t.Errorf("node 1 (no scheme) addr = %q; want 10.0.0.2:6380", o.Addr)
	}
	if o := got[2]; o.TLSConfig == nil || o.Username != "u" {
		t.Errorf("node 2 (rediss) TLS %v, user %q; want TLS and u", o.TLSConfig != nil, o.Username)
	}
	if _, err := ParseURLs(" , "); err == nil {
		t.Error("ParseURLs(empty list) = nil error")
	}
	if _, err := ParseURLs("redis://:secret@h:notaport"); err == nil {
		t.Error("ParseURLs(bad port) = nil error")
	} else if got := err.Error(); strings.Contains(got, "secret") {
		t.Errorf("error %q shows the password", got)
	}
}

func TestStartEmbedded_miniredis(t *testing.T) {
	t.Parallel()
	e, err := StartEmbedded(2, Miniredis)
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind != Miniredis || len(e.Addrs) != 2 {
		t.Errorf("StartEmbedded(2, miniredis) = kind %q, %d addrs", e.Kind, len(e.Addrs))
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := StartEmbedded(1, "nope"); err == nil {
		t.Error("StartEmbedded(kind nope) = nil error")
	}
}
