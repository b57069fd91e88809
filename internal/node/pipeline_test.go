package node

import (
	"context"
	"errors"
	"strconv"
	"testing"

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
