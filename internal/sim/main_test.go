package sim

import (
	"context"
	"os"
	"runtime/debug"
	"testing"

	"github.com/redis/go-redis/v9"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The nodes' Lua (a fresh interpreter per script in miniredis) allocates
	// most of what a seed does, and the bubbles' many goroutines make each
	// collection scan many stacks: collecting at 16x the live heap instead
	// of 1x ran seeds 1-200 in 13.7s instead of 22.4-24.5s on this 2-core
	// machine, in ~300 MB. GOGC in the environment still decides.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(1600)
	}
	goleak.VerifyTestMain(m)
}

type nopLogger struct{}

func (nopLogger) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(nopLogger{}) } // the pool's dial errors are the faults we inject
