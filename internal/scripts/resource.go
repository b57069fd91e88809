// Scripts about a resource beyond its lock: whether a token holds it
// (Holds, for Resume), whether any key does (Exists, for IsLocked), and a
// write guarded by a fencing token (FencedSet).

package scripts

import (
	"context"

	"github.com/redis/go-redis/v9"
)

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
