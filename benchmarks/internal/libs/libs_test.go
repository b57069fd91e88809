package libs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func miniNodes(t *testing.T, n int) []redis.UniversalClient {
	t.Helper()
	out := make([]redis.UniversalClient, n)
	for i := range out {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

// TestLibs checks every adapter on three miniredis nodes: a lock excludes a
// second owner, extends, unlocks, and can then be taken again.
func TestLibs(t *testing.T) {
	for _, lib := range All {
		t.Run(lib.Name, func(t *testing.T) {
			ns := lib.Nodes(miniNodes(t, 3))
			if lib.MaxNodes == 1 && len(ns) != 1 {
				t.Fatalf("Nodes gave %d nodes to a single-node library", len(ns))
			}
			lk, err := lib.New(ns, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lk.Close() })
			ctx := t.Context()
			h, err := lk.Lock(ctx, "r")
			if err != nil {
				t.Fatalf("Lock = %v", err)
			}
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if h2, err := lk.Lock(short, "r"); err == nil {
				h2.Unlock(ctx)
				t.Fatal("second Lock of a held resource succeeded")
			} else if !lib.Waits && !errors.Is(err, ErrNotObtained) {
				t.Errorf("floor's second Lock = %v; want ErrNotObtained", err)
			}
			if err := h.Extend(ctx); err != nil {
				t.Errorf("Extend = %v", err)
			}
			if err := h.Unlock(ctx); err != nil {
				t.Errorf("Unlock = %v", err)
			}
			h, err = lk.Lock(ctx, "r")
			if err != nil {
				t.Fatalf("Lock after Unlock = %v", err)
			}
			if err := h.Unlock(ctx); err != nil {
				t.Errorf("Unlock = %v", err)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	got, err := Select("floor, quorumlock")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "quorumlock" || got[1].Name != "floor" {
		t.Errorf("Select(floor, quorumlock) = %v; want quorumlock, floor in table order", got)
	}
	variants := 0
	for _, l := range All {
		if l.Variant {
			variants++
		}
	}
	if all, _ := Select("all"); len(all) != len(All)-variants {
		t.Errorf("Select(all) has %d libraries; want %d (every one but the %d variants)", len(all), len(All)-variants, variants)
	}
	if got, err := Select("quorumlock+poll"); err != nil || len(got) != 1 || !got[0].Variant {
		t.Errorf("Select(quorumlock+poll) = %v, %v; want the variant", got, err)
	}
	if _, err := Select("nope"); err == nil {
		t.Error("Select(nope) = nil error; want an unknown library error")
	}
}
