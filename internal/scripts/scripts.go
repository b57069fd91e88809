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
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed exists.lua
	existsSrc string

	acquire = redis.NewScript(acquireSrc)
	extend  = redis.NewScript(extendSrc)
	release = redis.NewScript(releaseSrc)
	exists  = redis.NewScript(existsSrc)
)

// Extended is the outcome of Extend on one node.
type Extended int8

// The outcomes of Extend.
const (
	NotOurs Extended = iota // another token holds the key
	Rearmed                 // the key held our token; its TTL was reset
	Healed                  // the key was absent; it was set again with our token
)

// Acquire sets key to token for ttl where it is absent, or refreshes it where
// it already holds token. It reports false when another token holds the key.
// A key of another type is an error (WRONGTYPE).
func Acquire(ctx context.Context, c redis.Scripter, key, token string, ttl time.Duration) (bool, error) {
	n, err := acquire.Run(ctx, c, []string{key}, token, ms(ttl)).Int64()
	return n == 1, err
}

// Extend re-arms key for ttl where it holds token, and sets it where it is
// absent.
func Extend(ctx context.Context, c redis.Scripter, key, token string, ttl time.Duration) (Extended, error) {
	n, err := extend.Run(ctx, c, []string{key}, token, ms(ttl)).Int64()
	if err != nil {
		return NotOurs, err
	}
	switch n {
	case 0, 1, 2:
		return Extended(n), nil
	}
	return NotOurs, fmt.Errorf("scripts: extend returned %d", n)
}

// Release deletes key if it holds token, and reports whether it did.
func Release(ctx context.Context, c redis.Scripter, key, token string) (bool, error) {
	n, err := release.Run(ctx, c, []string{key}, token).Int64()
	return n == 1, err
}

// Exists reports whether key exists, whoever holds it.
func Exists(ctx context.Context, c redis.Scripter, key string) (bool, error) {
	n, err := exists.Run(ctx, c, []string{key}).Int64()
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
