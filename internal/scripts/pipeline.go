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
// with arguments from ReleaseArgs (not yielding); on a pipeline from
// Loading, the first release of each kind of lock goes as EVAL instead.
// Read the outcome with ReleaseResult after Exec.
func ReleaseCmd(ctx context.Context, p redis.Pipeliner, k Keys, args []any) *redis.Cmd {
	set := k.set
	if lp, ok := p.(*loading); ok && lp.first(set) {
		return set.release.Eval(ctx, p, k.rel, args...)
	}
	return set.release.EvalSha(ctx, p, k.rel, args...)
}

// Loading returns p as a pipeline on which ReleaseCmd sends the first
// release of each kind of lock in full (EVAL), which caches the script on
// the server before the EVALSHAs behind it run: a node that does not have
// it (restarted, SCRIPT FLUSH) answers the whole pipeline in one round
// trip, where NOSCRIPT, SCRIPT LOAD and the pipeline again took three. A
// background release to a node with a round trip over half the node
// timeout never landed that way within it (TestReal_releaseRetryLoadsScriptInOneTrip).
// On a Cluster node the EVAL reaches one master only: a release for a key
// on another master that lacks the script still takes the NOSCRIPT path.
func Loading(p redis.Pipeliner) redis.Pipeliner { return &loading{Pipeliner: p} }

type loading struct {
	redis.Pipeliner
	sent []*scriptSet // kinds whose script was sent in full
}

// first reports whether set's script is sent in full for the first time
// on the pipeline, and records that it now is.
func (p *loading) first(set *scriptSet) bool {
	for _, s := range p.sent {
		if s == set {
			return false
		}
	}
	p.sent = append(p.sent, set)
	return true
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
	return k.set.extend.EvalSha(ctx, p, k.ext, token, ms(ttl), t, notAfter)
}

// ExtendResult reads the outcome of a command queued by ExtendCmd.
func ExtendResult(cmd *redis.Cmd) (Extended, error) {
	return parseExtended(cmd.Int64())
}
