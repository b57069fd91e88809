package redlockotel_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/otel"
	"github.com/quorumlock/quorumlock/redlock"
)

// nodeEvents returns the node and error.type of each redlock.node_error
// event of s, by node.
func nodeEvents(s sdktrace.ReadOnlySpan) map[int64]string {
	out := map[int64]string{}
	for _, e := range s.Events() {
		if e.Name != "redlock.node_error" {
			continue
		}
		var node int64 = -1
		var kind string
		for _, kv := range e.Attributes {
			switch kv.Key {
			case redlockotel.KeyNode:
				node = kv.Value.AsInt64()
			case redlockotel.KeyErrType:
				kind = kv.Value.AsString()
			}
		}
		out[node] = kind
	}
	return out
}

// TestNodeEvents_paused pauses two of three real nodes (SIGSTOP), so that
// an Extend call, an Unlock and a TryLock each wait for them until the node
// timeout, and checks that each span has a timeout event for each of them.
func TestNodeEvents_paused(t *testing.T) {
	rc := redistest.Start(t, 3)
	tel := newTelemetry(t)
	h, err := redlockotel.New(redlockotel.WithMeterProvider(tel.mp), redlockotel.WithTracerProvider(tel.tp))
	if err != nil {
		t.Fatal(err)
	}
	// No renewals: the lock stays valid for the 10s TTL while its nodes
	// are paused, so Extend fails for lack of answers, not for loss. The
	// node timeout is 1s (TTL/10, at most 1s): with a 2s TTL (200ms) the
	// healthy node 0 missed it once beside stress-ng at load 16–22, and
	// its timeout ended the attempt before node 1's.
	c, err := redlock.New(rc.Clients(), redlock.WithHooks(h), redlock.WithTTL(10*time.Second), redlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	l, err := c.Lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	rc.Pause(1)
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(1); rc.Resume(2) })
	if err := l.Extend(ctx); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("Extend with 2 of 3 nodes paused = %v; want ErrNoQuorum", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("Unlock with 2 of 3 nodes paused = %v; want ErrNoQuorum", err)
	}
	if _, err := c.TryLock(ctx, "y"); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("TryLock with 2 of 3 nodes paused = %v; want ErrNoQuorum", err)
	}
	want := map[int64]string{1: "timeout", 2: "timeout"}
	for _, tc := range []struct{ span, resource string }{
		{"redlock.extend", "x"}, {"redlock.release", "x"}, {"redlock.attempt", "y"},
	} {
		spans := spansNamed(tel.spans, tc.span, tc.resource)
		if len(spans) != 1 {
			t.Errorf("%d %s spans for %s; want 1", len(spans), tc.span, tc.resource)
			continue
		}
		got := nodeEvents(spans[0])
		if len(got) != len(want) || !slices.Equal([]string{got[1], got[2]}, []string{want[1], want[2]}) {
			t.Errorf("%s(%s) node events = %v; want %v", tc.span, tc.resource, got, want)
		}
	}
}
