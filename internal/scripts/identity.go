package scripts

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
)

// The identity written beside a lock key: an election's leader (package
// election) and a qlock permit's holder. One pair of scripts serves both,
// so the rule that a write landing after its holding's withdraw writes
// nothing lives in one place.
var (
	//go:embed proclaim.lua
	proclaimSrc string
	//go:embed withdraw.lua
	withdrawSrc string

	proclaimScript = redis.NewScript(proclaimSrc)
	withdrawScript = redis.NewScript(withdrawSrc)
)

// withdrawnKey is the key that marks the holding term withdrawn beside
// identity: one per term, so that no later term's withdraw overwrites it.
func withdrawnKey(identity, term string) string { return identity + ":withdrawn:" + term }

// Proclaim writes value, the identity of the holding term, to the key
// identity, only while lock holds token and term was not withdrawn there
// (Withdraw), with lock's remaining TTL: the identity never outlives the
// lock, and a write that lands after the withdraw — left running by a
// step decided at a majority, or its reply lost to a timeout — writes
// nothing, and so does one that runs once the node's clock passed
// notAfter (its TIME in ms; 0: no bound). It reports whether it wrote. It is sent with EVAL: one round
// trip always (a NOSCRIPT fallback takes two, which at a round trip past
// half the node timeout fails every first write on a fresh node).
func Proclaim(ctx context.Context, c redis.Scripter, lock, identity, term, token, value string, notAfter int64) (bool, error) {
	n, err := proclaimScript.Eval(ctx, c, []string{lock, identity, withdrawnKey(identity, term)}, token, value, notAfter).Int64()
	return n == 1, err
}

// Withdraw ends the holding term: it marks term withdrawn beside identity
// for lock's remaining TTL and at least floor (which must outlast any
// write of the term still able to land: package election passes the guard
// its node layer sizes from the writes' not-after bounds; it must be
// positive), then deletes identity where it still holds value (a
// successor's is never erased).
func Withdraw(ctx context.Context, c redis.Scripter, lock, identity, term, value string, floor time.Duration) error {
	keys := []string{identity, withdrawnKey(identity, term), lock}
	return withdrawScript.Eval(ctx, c, keys, value, floor.Milliseconds()).Err()
}
