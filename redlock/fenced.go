package redlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// ErrStaleFence is returned by FencedSet when the write carries a fencing
// token lower than one the resource has already seen: the writer's lock was
// lost and another holder has written since.
var ErrStaleFence = errors.New("redlock: stale fencing token")

// FencedSet is a write to a resource kept in Redis, protected by fencing
// tokens: it sets the field "value" of the hash key to value, atomically and
// only if token (a Lock's Fence()) is at least the highest token the key has
// seen; the token is then stored in the field "fence". A write with an older
// token returns ErrStaleFence and changes nothing.
//
// This is what makes a lock safe against a holder that was paused past its
// TTL: such a holder wakes up with an old token, and the resource itself
// refuses it. c is the Redis that holds the resource — any client, not
// necessarily one of the lock nodes.
func FencedSet(ctx context.Context, c redis.Scripter, key string, token int64, value string) error {
	if key == "" {
		return invalid("FencedSet: key must not be empty")
	}
	if token <= 0 {
		return invalid("FencedSet: token must be positive (a Lock acquired WithFencing(true)), got %d", token)
	}
	ok, err := scripts.FencedSet(ctx, c, key, token, value)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %d is older than the last token %q has seen", ErrStaleFence, token, key)
	}
	return nil
}
