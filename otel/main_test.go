package redlockotel_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// Tests make nodes fail on purpose; go-redis would log each failure.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}
