// Package scripts holds the Lua scripts that touch lock keys, and their Go
// wrappers. Every script checks ownership atomically on the node; no lock key
// is ever deleted or re-armed by a plain command.
//
// The wrappers run a script with [redis.Script.Run]: EVALSHA first, EVAL when
// the node answers NOSCRIPT (after a restart or SCRIPT FLUSH). They take only a
// [redis.Scripter], so tests can wrap a client to inject faults.
package scripts

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed commit.lua
	commitSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed exists.lua
	existsSrc string
	//go:embed fenced_set.lua
	fencedSetSrc string

	acquire = redis.NewScript(acquireSrc)
	commit  = redis.NewScript(commitSrc)
	extend  = redis.NewScript(extendSrc)
	release = redis.NewScript(releaseSrc)
	exists  = redis.NewScript(existsSrc)
	fenced  = redis.NewScript(fencedSetSrc)
)

// Keys names the keys of one lock on one node. Build it with NewKeys, which
// prepares the KEYS lists once for every script call of the lock.
type Keys struct {
	Lock  string // holds the owner's token, with a TTL
	Guard string // set by our release: requests of ours landing later set nothing
	Fence string // the fence counter; "" when fencing is off
	lock  []string
	rel   []string
	com   []string
}

// GuardSuffix joins a lock key and a token into the name of the token's
// release guard: lock key + GuardSuffix + token. It shares the lock key's
// hash tag, so one script can touch both on a Cluster node.
const GuardSuffix = ":released:"

// NewKeys returns the keys of the lock held by token: fence is "" when
// fencing is off.
func NewKeys(lock, fence, token string) Keys {
	k := Keys{Lock: lock, Guard: lock + GuardSuffix + token, Fence: fence}
	k.rel = []string{k.Lock, k.Guard}
	k.lock = k.rel
	if fence != "" {
		k.lock = []string{k.Lock, k.Guard, k.Fence}
		k.com = []string{k.Lock, k.Fence}
	}
	return k
}

// Extended is the outcome of Extend on one node.
type Extended int8

// The outcomes of Extend.
const (
	NotOurs Extended = iota // another token holds the key, or our release guards it
	Rearmed                 // the key held our token; its TTL was reset
	Healed                  // the key was absent; it was set again with our token
)

// Acquire sets the lock key to token for ttl where it is absent, or
// refreshes it where it already holds token — unless token was released on
// the node (its guard key exists). It reports whether the key holds token
// now, and, with a fence key, the node's fence counter (0 without). A key of
// another type is an error (WRONGTYPE).
func Acquire(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration) (bool, int64, error) {
	v, err := acquire.Run(ctx, c, k.lock, token, ms(ttl)).Result()
	if err != nil {
		return false, 0, err
	}
	ok, fence, young, err := parseAcquire(v)
	if young {
		return false, 0, fmt.Errorf("scripts: acquire returned %v", v)
	}
	return ok, fence, err
}

// parseAcquire reads the reply of the acquire script: 1 or 0, or {1 or 0,
// fence counter}, or from the guarded variant {-1, uptime} (young).
func parseAcquire(v any) (ok bool, n int64, young bool, err error) {
	switch v := v.(type) {
	case int64:
		if v == 0 || v == 1 {
			return v == 1, 0, false, nil
		}
	case []any:
		if len(v) == 2 {
			g, ok1 := v[0].(int64)
			n, ok2 := v[1].(int64)
			switch {
			case ok1 && ok2 && g == -1:
				return false, n, true, nil
			case ok1 && ok2 && (g == 0 || g == 1):
				return g == 1, n, false, nil
			}
		}
	}
	return false, 0, false, fmt.Errorf("scripts: acquire returned %v", v)
}

// Commit is phase 2 of a fenced acquire: it raises the fence counter to
// max(counter, t) where the lock key still holds token, and reports whether
// it did.
func Commit(ctx context.Context, c redis.Scripter, k Keys, token string, t int64) (bool, error) {
	n, err := commit.Run(ctx, c, k.com, token, t).Int64()
	return n == 1, err
}

// Extend re-arms the lock key for ttl where it holds token, and sets it
// where it is absent (unless token was released there); with a fence key it
// also raises the counter to t there.
func Extend(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, t int64) (Extended, error) {
	return parseExtended(extend.Run(ctx, c, k.lock, token, ms(ttl), t).Int64())
}

// ExtendCmd queues Extend on a pipeline, as EVALSHA: load the script on
// the node first (Load), or redo the commands that fail with NOSCRIPT
// after loading it. Read the outcome with ExtendResult after Exec.
func ExtendCmd(ctx context.Context, p redis.Pipeliner, k Keys, token string, ttl time.Duration, t int64) *redis.Cmd {
	return extend.EvalSha(ctx, p, k.lock, token, ms(ttl), t)
}

// ExtendResult reads the outcome of a command queued by ExtendCmd.
func ExtendResult(cmd *redis.Cmd) (Extended, error) {
	return parseExtended(cmd.Int64())
}

func parseExtended(n int64, err error) (Extended, error) {
	if err != nil {
		return NotOurs, err
	}
	switch n {
	case 0, 1, 2:
		return Extended(n), nil
	}
	return NotOurs, fmt.Errorf("scripts: extend returned %d", n)
}

// Script names a script for Load.
type Script int8

// The scripts a pipeline may need loaded.
const (
	ExtendScript Script = iota
	ReleaseScript
)

// Load loads a script on a node (SCRIPT LOAD), for pipelines of EVALSHA.
func Load(ctx context.Context, c redis.Scripter, s Script) error {
	if s == ReleaseScript {
		return release.Load(ctx, c).Err()
	}
	return extend.Load(ctx, c).Err()
}

// IsNoScript reports whether err is a node's NOSCRIPT reply.
func IsNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
}

// Release is check-and-delete: it deletes the lock key if it holds token,
// and reports whether it did. With guard > 0 it also sets the token's guard
// key for guard, whatever the lock key holds, so that a request of ours
// still in flight cannot set the key again when it lands (see Acquire,
// Extend). A release that deleted the key publishes on channel (unless "")
// when someone listens there.
//
// A release whose wake-up message the node refused (an ACL without the
// channel) still deletes the key: it reports true with ErrNotPublished.
//
// On a Cluster node (cluster), PUBSUB NUMSUB counts only the subscribers
// connected to that one node while a message reaches the whole cluster, so
// the message is published whether or not the node sees a listener.
func Release(ctx context.Context, c redis.Scripter, k Keys, token string, guard time.Duration, channel string, cluster bool) (bool, error) {
	return parseReleased(release.Run(ctx, c, k.rel, releaseArgs(token, guard, channel, cluster)...).Int64())
}

// ReleaseCmd queues Release on a pipeline, as EVALSHA (see ExtendCmd). Read
// the outcome with ReleaseResult after Exec.
func ReleaseCmd(ctx context.Context, p redis.Pipeliner, k Keys, token string, guard time.Duration, channel string, cluster bool) *redis.Cmd {
	return release.EvalSha(ctx, p, k.rel, releaseArgs(token, guard, channel, cluster)...)
}

// ReleaseResult reads the outcome of a command queued by ReleaseCmd.
func ReleaseResult(cmd *redis.Cmd) (bool, error) {
	return parseReleased(cmd.Int64())
}

func releaseArgs(token string, guard time.Duration, channel string, cluster bool) []any {
	g := int64(0)
	if guard > 0 {
		g = ms(guard)
	}
	cl := "0"
	if cluster {
		cl = "1"
	}
	return []any{token, g, channel, cl}
}

func parseReleased(n int64, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	switch n {
	case 0, 1:
		return n == 1, nil
	case 2:
		return true, ErrNotPublished
	}
	return false, fmt.Errorf("scripts: release returned %d", n)
}

// ErrNotPublished is returned with a successful Release whose wake-up
// message could not be published on the node.
var ErrNotPublished = errors.New("scripts: released, but the node refused to publish the wake-up message (check the ACL's channel rights)")

// Exists reports whether key exists, whoever holds it.
func Exists(ctx context.Context, c redis.Scripter, key string) (bool, error) {
	n, err := exists.Run(ctx, c, []string{key}).Int64()
	return n == 1, err
}

// FencedSet writes value to the hash key if token is at least the highest
// fence token the key has seen, and reports whether it did.
func FencedSet(ctx context.Context, c redis.Scripter, key string, token int64, value string) (bool, error) {
	n, err := fenced.Run(ctx, c, []string{key}, token, value).Int64()
	return n == 1, err
}

// ms converts a TTL to whole milliseconds for PX/PEXPIRE, never below 1
// (PX 0 is an error).
func ms(d time.Duration) int64 {
	if m := d.Milliseconds(); m > 0 {
		return m
	}
	return 1
}
