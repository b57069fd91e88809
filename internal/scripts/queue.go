package scripts

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiter is how an acquire request queues a waiting Lock call, and how a
// release yields to the queue. The zero Waiter does not queue.
type Waiter struct {
	Member string        // from Member; "" when not waiting
	Ticket int64         // taken once per Lock call: (Ticket, Member) orders the queue
	Lapse  time.Duration // the entry lapses this long after its latest attempt, unless a later one refreshes it
	// Attempt numbers the waiter's attempts (and yields): the node keeps
	// the number of the latest one that queued or refreshed the entry,
	// and a handoff names it (see ParseHandoff).
	Attempt int64
	// Fresh says that no request carrying Member was sent before, so no
	// entry of it can be queued anywhere yet: the acquire script does not
	// look for one to replace (one command less on a first attempt).
	Fresh bool
}

// ParseHandoff reads a handoff message: the token the key was handed to on
// the node, and the number of that waiter's attempt that queued or last
// refreshed its entry there; the key was set after that attempt was sent.
// A message without a number (an older release) gives attempt 0.
func ParseHandoff(payload string) (token string, attempt int64) {
	i := strings.LastIndexByte(payload, ' ')
	if i < 0 {
		return payload, 0
	}
	n, err := strconv.ParseInt(payload[i+1:], 10, 64)
	if err != nil {
		return payload, 0
	}
	return payload[:i], n
}

// WakeArg is the wake-up argument of Acquire and Release: the prefix of the
// Clients' channels, and whether the node can count who listens on them
// (false on Redis Cluster nodes, where a Client's channel is on another
// shard than the key: a release then hands the key to the first waiter
// without knowing whether it is still there).
func WakeArg(channelPrefix string, countListeners bool) string {
	if countListeners {
		return "1" + channelPrefix
	}
	return "0" + channelPrefix
}

// Member names a waiting token of a client in the queue, with the
// reservation a release hands it the key for (a short time the waiter's own
// renewal extends to its TTL): "client/reservation ms/token". client must
// not contain "/" or "#". The plain lock's queue entry is EntryPrefix of it,
// then "#lapse deadline#attempt" (queue.lua); read-write queues keep the
// member as it is.
func Member(client string, reservation time.Duration, token string) string {
	return client + "/" + strconv.FormatInt(ms(reservation), 10) + "/" + token
}

// EntryPrefix is the start of the plain lock's queue entries of member:
// "client#reservation ms#token", then "#" (queue.lua).
func EntryPrefix(member string) string {
	return strings.Replace(member, "/", "#", 2) + "#"
}

// Leave takes the entries of w.Member out of the queue of k, and does
// nothing else.
func Leave(ctx context.Context, c redis.Scripter, k Keys, w Waiter) error {
	return leave.Run(ctx, c, k.rel, w.Member, w.Ticket).Err()
}
