package redlock

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	if addrs := os.Getenv(childWaiterEnv); addrs != "" {
		runChildWaiter(addrs) // never returns
	}
	// Fault tests kill and cut nodes on purpose; go-redis would log every
	// failed dial.
	redis.SetLogger(quietLogger{})
	// 3 per CPU: see WaitingParallel.
	redistest.WaitingParallel(3)
	goleak.VerifyTestMain(m)
}
