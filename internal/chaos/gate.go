package chaos

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// gate pauses one client's traffic to every node: a go-redis hook on each of
// its node clients holds every command while the gate is shut, until the
// gate opens or the command's ctx ends. Shut together with a holder's
// goroutine sleeping in its critical section, it stands for a paused client
// process: its renewals go nowhere, while the library's own deadline timer,
// which a real pause would also freeze, still reports the loss on time. The
// checker ends the hold at ValidUntil either way.
type gate struct {
	mu   sync.Mutex    // protects open
	open chan struct{} // closed while the gate is open
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

// shut holds every command from now on.
func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// release lets commands through again, the held ones first.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ redis.Hook = (*gate)(nil)

// DialHook lets dials through: commands are what the gate holds.
func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := g.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := g.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}
