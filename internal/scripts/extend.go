package scripts

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Extended is the outcome of Extend on one node.
type Extended int8

// The outcomes of Extend.
const (
	Refused Extended = iota // another token holds the key, or our release guards it
	Rearmed                 // the key held our token; its TTL was reset
	Healed                  // the key was absent; it was set again with our token
)

// Extend re-arms the lock key for ttl where it holds token, and sets it
// where it is absent (unless token was released there); with a fence key it
// also raises the counter to t there. It sends no not-after bound.
func Extend(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, t int64) (Extended, error) {
	return PrepareExtend(k, token, ttl, t).Extend(ctx, c, nil)
}

// Prepared is one script call on one node, built once — keys and the
// arguments that stay the same — for a lock that sends it again and again
// (Extend, on every renewal). It is safe for concurrent use.
type Prepared struct {
	s     script
	keys  []string
	boxed []any // keys, boxed behind their count (see boxKeys)
	args  []any // the arguments but the not-after bound
}

// PrepareExtend prepares Extend(k, token, ttl, t); run it with
// Prepared.Extend.
func PrepareExtend(k Keys, token string, ttl time.Duration, t int64) Prepared {
	s := k.set.extend
	return Prepared{s: s, keys: k.ext, boxed: k.extv, args: []any{token, ms(ttl), t}}
}

// PrepareRearm prepares an Extend of a plain lock's key that re-arms it
// only where it holds token, and never sets it where it is absent: run it
// with Prepared.Extend, whose outcome is then never Healed. Resume sends
// it, so that a key that expired after Resume read it is not set again
// before a majority confirmed the token in the same round.
func PrepareRearm(k Keys, token string, ttl time.Duration) Prepared {
	return Prepared{s: rearm, keys: k.ext, boxed: k.extv, args: []any{token, ms(ttl), 0}}
}

// Extend runs a call prepared by PrepareExtend on c, as Extend does, with
// a not-after bound (see AcquireWith; nil or 0: none).
func (p Prepared) Extend(ctx context.Context, c redis.Scripter, notAfter *int64) (Extended, error) {
	return parseExtended(p.s.run(ctx, c, p.keys, p.boxed, p.args, notAfter).Int64())
}

func parseExtended(n int64, err error) (Extended, error) {
	if err != nil {
		return Refused, err
	}
	switch n {
	case 0, 1, 2:
		return Extended(n), nil
	case -1: // past the not-after bound (extend.lua)
		return Refused, ErrLate
	}
	return Refused, fmt.Errorf("scripts: extend returned %d", n)
}

// healBranch is the branch of extend.lua that sets an absent key again;
// rearm is extend.lua without it.
const healBranch = `elseif v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  r = 2
`
