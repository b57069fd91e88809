// The scripts in pipelines: batched renewals (ExtendCmd) and the retry
// loop's releases (ReleaseCmd), which need the scripts loaded first (Load).

package scripts

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script names a script for Load.
type Script int8

// The scripts a pipeline may need loaded.
const (
	ExtendScript Script = iota
	ReleaseScript
)

// Load loads a script on a node (SCRIPT LOAD), for pipelines of EVALSHA:
// the script of every kind of lock (plain, reader, writer, multi), as one
// pipeline may carry them all.
func Load(ctx context.Context, c redis.Scripter, s Script) error {
	for _, set := range []*scriptSet{plainSet, readSet, writeSet, multiSet} {
		sc := set.extend
		if s == ReleaseScript {
			sc = set.release
		}
		if err := sc.Load(ctx, c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// IsNoScript reports whether err is a node's NOSCRIPT reply.
func IsNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
}

// ReleaseCmd queues Release on a pipeline, as EVALSHA (see ExtendCmd),
// with arguments from ReleaseArgs (not yielding). Read the outcome with
// ReleaseResult after Exec.
func ReleaseCmd(ctx context.Context, p redis.Pipeliner, k Keys, args []any) *redis.Cmd {
	return k.kind().release.EvalSha(ctx, p, k.rel, args...)
}

// ReleaseResult reads the outcome of a command queued by ReleaseCmd.
func ReleaseResult(cmd *redis.Cmd) (Released, error) {
	return parseReleased(cmd.Int64())
}

// ExtendCmd queues Extend on a pipeline, as EVALSHA, with a not-after
// bound (see AcquireWith; nil or 0: none): load the script on the node
// first (Load), or redo the commands that fail with NOSCRIPT after loading
// it. Read the outcome with ExtendResult after Exec.
func ExtendCmd(ctx context.Context, p redis.Pipeliner, k Keys, token string, ttl time.Duration, t int64, notAfter *int64) *redis.Cmd {
	return k.kind().extend.EvalSha(ctx, p, k.ext, token, ms(ttl), t, notAfter)
}

// ExtendResult reads the outcome of a command queued by ExtendCmd.
func ExtendResult(cmd *redis.Cmd) (Extended, error) {
	return parseExtended(cmd.Int64())
}
