package chaos

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	RunChildIfAsked() // the frozen-waiter profile's child process
	// The nemesis kills and cuts nodes on purpose; go-redis would log every
	// failed dial.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}
