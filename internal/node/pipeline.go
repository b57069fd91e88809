package node

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// pipelineChunk is the most commands one pipeline carries.
const pipelineChunk = 512

// pipeline sends one command of script s per item (queue builds item k's)
// to nc in pipelines of at most pipelineChunk, all bounded by ctx: the one
// way a request of many items (Batch, Resend) reaches a node. Items that
// find the script missing on the node (NOSCRIPT: a restart or SCRIPT
// FLUSH) are sent again once it is loaded. It returns each item's command,
// whose error is that item's error reply; a connection error or timeout
// fails the node for every item. Such an error after an earlier chunk or
// pass was written (a failed script load too) is marked (mayHaveLanded), so that do never reads it as
// a request that was never written, whoever the caller.
func pipeline(ctx context.Context, nc redis.UniversalClient, count int, s scripts.Script, queue func(p redis.Pipeliner, k int) *redis.Cmd) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, count)
	todo := make([]int, count)
	for k := range todo {
		todo[k] = k
	}
	for pass := 0; len(todo) > 0; pass++ {
		var again []int
		for lo := 0; lo < len(todo); lo += pipelineChunk {
			part := todo[lo:min(lo+pipelineChunk, len(todo))]
			pipe := nc.Pipeline()
			if s == scripts.ReleaseScript && pass == 0 {
				// A release must land within its node timeout, whatever
				// the node's script cache (scripts.Loading).
				pipe = scripts.Loading(pipe)
			}
			for _, k := range part {
				cmds[k] = queue(pipe, k)
			}
			_, _ = pipe.Exec(ctx)
			for _, k := range part {
				err := cmds[k].Err()
				var re redis.Error
				switch {
				case err == nil:
				case scripts.IsNoScript(err) && pass == 0:
					again = append(again, k)
				case !errors.As(err, &re):
					// The node, not the item: a connection error or
					// timeout. Commands written before it may have landed.
					if lo > 0 || pass > 0 {
						err = mayHaveLanded(err)
					}
					return nil, err
				}
			}
		}
		if len(again) > 0 {
			if err := scripts.Load(ctx, nc, s); err != nil {
				return nil, mayHaveLanded(err) // the pass before it was written
			}
		}
		todo = again
	}
	return cmds, nil
}
