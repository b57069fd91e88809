package hold

import (
	"io"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMeasure(t *testing.T) {
	rc := redistest.Start(t, 3)
	opts := make([]*redis.Options, rc.N())
	for i := range rc.N() {
		opts[i] = &redis.Options{Addr: rc.ServerAddr(i)}
	}
	for _, mode := range []string{"batched", "unbatched"} {
		r, err := Measure(t.Context(), opts, 50, mode, 900*time.Millisecond, 1200*time.Millisecond, io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		// Renewed every 300ms for 1.2s: about 4 rounds of 50.
		if r.Losses != 0 || r.Renewals < 100 || r.RTTPerNodeSec <= 0 {
			t.Errorf("%s: %+v; want no loss, ≥ 100 renewals, round trips counted", mode, r)
		}
		if mode == "batched" && r.RTTPerNodeSec >= float64(r.Renewals) {
			t.Errorf("batched: %.0f round trips/node/s for %d renewals; want far fewer (pipelines)", r.RTTPerNodeSec, r.Renewals)
		}
	}
	if _, err := Measure(t.Context(), opts, 1, "sideways", time.Second, time.Millisecond, io.Discard); err == nil {
		t.Errorf("Measure with an unknown mode = nil error")
	}
}
