package sim

import (
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/testhooks"
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
	testhooks.ExtendPause.Store(&sendDelay)
	testhooks.AfterHold.Store(&afterHold) // the expired-grant episode's starved caller (expired.go)
	goleak.VerifyTestMain(m)
}

var (
	sendDelayMax = flag.Duration("sim.send-delay", 50*time.Millisecond, "an extension sleeps up to this long (fake time) between its registration and its send, one in three (0: never)")
	sendMu       sync.Mutex // protects sendRand
	sendRand     = rand.New(rand.NewPCG(33, 30))
)

// sendDelay is the schedule perturbation between an extension's
// registration and its send (testhooks.ExtendPause, issue 30): one
// extension in three sleeps up to -sim.send-delay in the bubble's fake
// time, so that a release, a renewal or another Extend runs in between.
// It is set for the whole package: the draws are shared by the bubbles
// running at once, so their order follows scheduling (as the jitter of
// the fault layer does). A round's not-after bound is fixed when it is
// registered (internal/node's Token), before the delay. The default stays
// below the node timeout; a delay longer than the node timeout (say
// -sim.send-delay=1s) makes renewals miss their deadlines, and a live Do
// hold whose renewals do not leave looks like a token given up: the
// checker counts such a delay as the run's Clients' own fault
// (NoteSendPause), so spurious-loss and key-back do not report it.
var sendDelay = func() {
	most := *sendDelayMax
	if most <= 0 {
		return
	}
	sendMu.Lock()
	d := time.Duration(0)
	if sendRand.IntN(3) == 0 {
		d = time.Duration(sendRand.Int64N(int64(most)))
	}
	sendMu.Unlock()
	if d > 0 {
		NoteSendPause(d)
		time.Sleep(d)
	}
}

type nopLogger struct{}

func (nopLogger) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(nopLogger{}) } // the pool's dial errors are the faults we inject
