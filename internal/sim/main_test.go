package sim

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type nopLogger struct{}

func (nopLogger) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(nopLogger{}) } // the pool's dial errors are the faults we inject
