package redlockprom_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// The scrape test pauses nodes on purpose; go-redis would log every
	// request that timed out.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}
