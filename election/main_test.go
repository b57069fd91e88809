package election_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// Fault tests kill and pause nodes on purpose; go-redis would log every
	// failed dial.
	redis.SetLogger(quietLogger{})
	redistest.WaitingParallel(2)
	goleak.VerifyTestMain(m)
}
