package node

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/scripts"
)

// TestPipeline_failureAfterAWrittenChunkMayHaveLanded: a node client with
// retries off (MaxRetries -1) whose node dies between two chunks of one
// pipeline fails the second with a dial error, which alone would read as
// never written (neverWrote); the first chunk was written, and landed, so
// the failure must not say so. The control: the node dead before the first
// chunk, whose dial error proves nothing was written.
func TestPipeline_failureAfterAWrittenChunkMayHaveLanded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		killAt int // the item whose queueing kills the node
		landed bool
	}{
		{"dies before the second chunk", pipelineChunk, true},
		{"dies before the first chunk", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := redistest.Start(t, 1)
			nc := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(0), MaxRetries: -1})
			defer nc.Close()
			ctx := t.Context()
			if err := nc.Ping(ctx).Err(); err != nil { // a connection pooled
				t.Fatal(err)
			}
			cmds, err := pipeline(ctx, nc, pipelineChunk+1, scripts.ExtendScript, func(p redis.Pipeliner, k int) *redis.Cmd {
				if k == tc.killAt {
					rc.Kill(0)
				}
				return p.Do(context.Background(), "SET", "k"+strconv.Itoa(k), "v")
			})
			if err == nil || cmds != nil {
				t.Fatalf("pipeline() = %v, %v; want no commands and the node's error", cmds, err)
			}
			if got := errors.Is(err, errMayHaveLanded); got != tc.landed {
				t.Errorf("pipeline() error %v marked may-have-landed: %v, want %v", err, got, tc.landed)
			}
			if got := neverWrote(err); got == tc.landed {
				t.Errorf("neverWrote(%v) = %v, want %v", err, got, !tc.landed)
			}
		})
	}
}

// TestPipeline_failedScriptLoadAfterAWrittenPassMayHaveLanded: a pass
// whose items found the script missing (NOSCRIPT) loads it before sending
// them again; that pass was written, and its other items landed, so a
// failure of the load, even a dial error on a client with retries off,
// must not read as never written. The node's dials are refused from the
// first pass's answer on, and its pooled connection is dropped as idle.
func TestPipeline_failedScriptLoadAfterAWrittenPassMayHaveLanded(t *testing.T) {
	rc := redistest.Start(t, 1)
	var refuse atomic.Bool
	var d net.Dialer
	nc := redis.NewClient(&redis.Options{
		Addr: rc.ServerAddr(0), MaxRetries: -1, ConnMaxIdleTime: time.Millisecond,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			return d.DialContext(ctx, network, addr)
		},
	})
	defer nc.Close()
	nc.AddHook(afterPipeline(func() {
		refuse.Store(true)
		time.Sleep(10 * time.Millisecond) // the pooled connection is idle past ConnMaxIdleTime
	}))
	cmds, err := pipeline(t.Context(), nc, 2, scripts.ExtendScript, func(p redis.Pipeliner, k int) *redis.Cmd {
		if k == 0 {
			return p.Do(context.Background(), "SET", "k0", "v") // lands
		}
		return p.Do(context.Background(), "EVALSHA", "0000000000000000000000000000000000000000", 0) // NOSCRIPT
	})
	if err == nil || cmds != nil {
		t.Fatalf("pipeline() = %v, %v; want no commands and the node's error", cmds, err)
	}
	if v, _ := rc.Client(0).Get(t.Context(), "k0").Result(); v != "v" {
		t.Fatalf("the first pass's SET did not land (k0 = %q)", v)
	}
	if !errors.Is(err, errMayHaveLanded) || neverWrote(err) {
		t.Errorf("pipeline() error %v: marked may-have-landed %v, neverWrote %v; want marked, not never written (the first pass landed)", err, errors.Is(err, errMayHaveLanded), neverWrote(err))
	}
}

// afterPipeline is a go-redis hook that runs f once a pipeline is answered.
type afterPipeline func()

func (afterPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (afterPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f afterPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		f()
		return err
	}
}
