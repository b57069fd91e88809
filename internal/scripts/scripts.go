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
// prepares the KEYS list once for every script call of the lock.
type Keys struct {
	Lock  string // holds the owner's token, with a TTL
	Fence string // the fence counter; "" when fencing is off
	all   []string
}

// NewKeys returns the keys of a lock: fence is "" when fencing is off.
func NewKeys(lock, fence string) Keys {
	k := Keys{Lock: lock, Fence: fence}
	k.all = k.list()
	return k
}

func (k Keys) list() []string {
	switch {
	case k.all != nil:
		return k.all
	case k.Fence == "":
		return []string{k.Lock}
	}
	return []string{k.Lock, k.Fence}
}

// Extended is the outcome of Extend on one node.
type Extended int8

// The outcomes of Extend.
const (
	NotOurs Extended = iota // another token holds the key
	Rearmed                 // the key held our token; its TTL was reset
	Healed                  // the key was absent; it was set again with our token
)

// Acquire sets the lock key to token for ttl where it is absent, or
// refreshes it where it already holds token; a waiter may also take a
// handoff marker left by Release. It reports whether the key holds token
// now, and, with a fence key, the node's fence counter (0 without). A key of
// another type is an error (WRONGTYPE).
func Acquire(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, waiter bool) (bool, int64, error) {
	w := "0"
	if waiter {
		w = "1"
	}
	v, err := acquire.Run(ctx, c, k.list(), token, ms(ttl), w).Result()
	if err != nil {
		return false, 0, err
	}
	switch v := v.(type) {
	case int64:
		return v == 1, 0, nil
	case []any:
		if len(v) == 2 {
			ok, ok1 := v[0].(int64)
			fence, ok2 := v[1].(int64)
			if ok1 && ok2 {
				return ok == 1, fence, nil
			}
		}
	}
	return false, 0, fmt.Errorf("scripts: acquire returned %v", v)
}

// Commit is phase 2 of a fenced acquire: it raises the fence counter to
// max(counter, t) where the lock key still holds token, and reports whether
// it did.
func Commit(ctx context.Context, c redis.Scripter, k Keys, token string, t int64) (bool, error) {
	n, err := commit.Run(ctx, c, k.list(), token, t).Int64()
	return n == 1, err
}

// Extend re-arms the lock key for ttl where it holds token, and sets it
// where it is absent; with a fence key it also raises the counter to t
// there.
func Extend(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, t int64) (Extended, error) {
	n, err := extend.Run(ctx, c, k.list(), token, ms(ttl), t).Int64()
	if err != nil {
		return NotOurs, err
	}
	switch n {
	case 0, 1, 2:
		return Extended(n), nil
	}
	return NotOurs, fmt.Errorf("scripts: extend returned %d", n)
}

// ExtendCmd queues Extend on a pipeline, as EVALSHA: load the script on
// the node first (LoadExtend), or redo the commands that fail with NOSCRIPT
// after loading it. Read the outcome with ExtendResult after Exec.
func ExtendCmd(ctx context.Context, p redis.Pipeliner, k Keys, token string, ttl time.Duration, t int64) *redis.Cmd {
	return extend.EvalSha(ctx, p, k.list(), token, ms(ttl), t)
}

// ExtendResult reads the outcome of a command queued by ExtendCmd.
func ExtendResult(cmd *redis.Cmd) (Extended, error) {
	n, err := cmd.Int64()
	if err != nil {
		return NotOurs, err
	}
	switch n {
	case 0, 1, 2:
		return Extended(n), nil
	}
	return NotOurs, fmt.Errorf("scripts: extend returned %d", n)
}

// LoadExtend loads the extend script on a node (SCRIPT LOAD).
func LoadExtend(ctx context.Context, c redis.Scripter) error {
	return extend.Load(ctx, c).Err()
}

// IsNoScript reports whether err is a node's NOSCRIPT reply.
func IsNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
}

// Release frees key if it holds token, and reports whether it did. It
// publishes on channel (unless ""); when someone listens there and handoff
// is positive, it leaves a marker for handoff that only a waiter may take;
// otherwise a tombstone for tombstone, free for everyone but token, so that
// a request of ours still in flight cannot set the key again.
//
// A release whose wake-up message the node refused (an ACL without the
// channel) still deletes the key: it reports true with ErrNotPublished.
//
// On a Cluster node (cluster), PUBSUB NUMSUB counts only the subscribers
// connected to that one node while a message reaches the whole cluster, so
// the message is published whether or not the node sees a listener.
func Release(ctx context.Context, c redis.Scripter, key, token, channel string, handoff, tombstone time.Duration, cluster bool) (bool, error) {
	h := int64(0)
	if handoff > 0 {
		h = ms(handoff)
	}
	cl := "0"
	if cluster {
		cl = "1"
	}
	n, err := release.Run(ctx, c, []string{key}, token, channel, h, ms(tombstone), cl).Int64()
	if n == 2 {
		return true, ErrNotPublished
	}
	return n == 1, err
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
