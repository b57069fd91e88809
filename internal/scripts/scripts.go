// Package scripts holds the Lua scripts that touch lock keys, and their Go
// wrappers. Every script checks ownership atomically on the node; no lock key
// is ever deleted or re-armed by a plain command.
//
// The wrappers run a script as EVALSHA, and as EVAL when the node answers
// NOSCRIPT (after a restart or SCRIPT FLUSH), like [redis.Script.Run]. They take only a
// [redis.Scripter], so tests can wrap a client to inject faults.
package scripts

import (
	"context"
	_ "embed"
	"strings"
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
	//go:embed holds.lua
	holdsSrc string
	//go:embed leave.lua
	leaveSrc string
	//go:embed fenced_set.lua
	fencedSetSrc string
	//go:embed queue.lua
	queueSrc string // the queue's functions, prepended to acquire and release

	acquire = newScript(queueSrc + acquireSrc)
	commit  = newScript(commitSrc)
	extend  = newScript(extendSrc)
	release = newScript(queueSrc + releaseSrc)
	// releaseTieKeeps is release with the queue's order before issue 20
	// (testhooks.QueueTieKeeps): a caller whose ticket equals the head's
	// goes first, whatever the members, so a yielding waiter keeps its
	// nodes on a tie.
	releaseTieKeeps = newScript(strings.Replace(queueSrc, tieRule, "return ticket <= t", 1) + releaseSrc)
	exists          = newScript(existsSrc)
	holds           = newScript(holdsSrc)
	leave           = newScript(queueSrc + leaveSrc)
	fenced          = newScript(fencedSetSrc)

	// plainSet is the plain lock's scripts; Keys of other kinds carry
	// their own (rwkeys.go).
	plainSet = &scriptSet{acquire: acquire, acquireGuarded: acquireGuarded, extend: extend, release: release}
)

// script is a Lua script whose EVALSHA command head is boxed once.
type script struct {
	*redis.Script
	sha any // the script's SHA1, boxed for the command's arguments
}

func newScript(src string) script {
	s := redis.NewScript(src)
	return script{Script: s, sha: s.Hash()}
}

// processor is the part of a node client the wrappers use: it sends a
// command built here. Every redis.UniversalClient has it.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run runs the script with keys (boxed: numkeys first, then the keys; see
// boxKeys) and args as given, as EVALSHA, and as EVAL when the node answers
// NOSCRIPT (after a restart or SCRIPT FLUSH), like redis.Script.Run. Unlike
// Script.Run it does not box the keys and arguments again for each
// request: the command is the keys and arguments of the lock, boxed once,
// behind the script's head. A client without Process gets Script.Run.
func (s script) run(ctx context.Context, c redis.Scripter, keys []string, boxed []any, args []any, last ...any) *redis.Cmd {
	return s.runCmd(ctx, c, keys, s.evalshaCmd(boxed, args, last...))
}

// runCmd is run with the whole EVALSHA command built already (see
// evalshaCmd): nothing is allocated for it per request.
func (s script) runCmd(ctx context.Context, c redis.Scripter, keys []string, cmd []any) *redis.Cmd {
	p, ok := c.(processor)
	if !ok {
		return s.Run(ctx, c, keys, cmd[2+1+len(keys):]...)
	}
	return s.process(ctx, p, c, keys, cmd)
}

func (s script) process(ctx context.Context, p processor, c redis.Scripter, keys []string, cmd []any) *redis.Cmd {
	r := redis.NewCmd(ctx, cmd...)
	if len(keys) > 0 {
		r.SetFirstKeyPos(3) // as EvalSha does: Cluster routes by the first key
	}
	if err := p.Process(ctx, r); err != nil && IsNoScript(err) {
		return s.Eval(ctx, c, keys, cmd[2+1+len(keys):]...)
	}
	return r
}

// evalshaCmd returns the whole EVALSHA command of s for boxed keys, args
// and then last (one allocation for all of it).
func (s script) evalshaCmd(boxed []any, args []any, last ...any) []any {
	cmd := make([]any, 0, 2+len(boxed)+len(args)+len(last))
	cmd = append(cmd, "evalsha", s.sha)
	cmd = append(cmd, boxed...)
	cmd = append(cmd, args...)
	return append(cmd, last...)
}

// numKeys are the boxed key counts of the scripts' commands.
var numKeys = [...]any{"0", "1", "2", "3", "4", "5", "6", "7", "8"}

// boxKeys returns numkeys and keys, boxed once for every request that
// sends them.
func boxKeys(keys []string) []any {
	b := make([]any, 1+len(keys))
	b[0] = numKeys[len(keys)]
	for i, k := range keys {
		b[1+i] = k
	}
	return b
}

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

// Holds reports whether the lock key of k holds token. It writes nothing.
func Holds(ctx context.Context, c redis.Scripter, k Keys, token string) (bool, error) {
	n, err := holds.Run(ctx, c, []string{k.Lock}, token).Int64()
	return n == 1, err
}

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
