package election

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/holder"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// Leader describes a term of office: who leads, since when.
type Leader struct {
	Identity string    `json:"id"`
	Term     string    `json:"term"`  // random, unique per term; tells two terms of one identity apart
	Fence    int64     `json:"fence"` // the term's fencing token; 0 unless the lock uses redlock.WithFencing
	Since    time.Time `json:"since"` // when the term began, by the leader's clock
}

// IsZero reports whether l is the zero Leader: no leader.
func (l Leader) IsZero() bool { return l.Term == "" }

func newTermID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// noQuorum joins ErrNoQuorum, with a head saying how many answered, and the
// node errors.
func noQuorum(head string, errs []error) error {
	all := []error{fmt.Errorf("%w: %s", ErrNoQuorum, head)}
	for _, err := range errs {
		if err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// Leader returns the current leader as a majority of nodes sees it: the
// identity that a majority of nodes hold for this election. It reads every
// node in parallel and returns as soon as the answer is known — a majority
// holds one identity, or none can any more — without waiting for a node
// that is slow or down. It waits at most until ctx ends or the node timeout
// (WithNodeTimeout) passes, whatever the node clients' options; a read it
// stops waiting for runs on in the background, to the node timeout at the
// most (a request cut short would cost its pooled connection).
//
// It returns an error matching ErrNoLeader when a majority answered but
// holds no common leader (none was elected, or it resigned, or its lease
// ran out), and ErrNoQuorum, joined with one *redlock.NodeError per failed
// node, when too few nodes answered to tell (after Close of the redlock
// Client, the node errors match redlock.ErrClosed).
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	r := holder.Start(e.hn, ctx, false, func(ctx context.Context, i int, n redis.UniversalClient, _ int64) (string, error) {
		v, err := n.Get(ctx, e.identityKey(i)).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		return v, err
	})
	// classify and decide run on this goroutine: no lock needed.
	count := make(map[string]int) // per identity value, the nodes holding it
	best, bestValue := 0, ""      // the value most nodes hold
	t := r.Collect(ctx, func(i int, rep quorum.Reply[string]) (quorum.Vote, error) {
		if rep.Err != nil {
			return quorum.Failed, rep.Err
		}
		if v := rep.Val; v != "" {
			if count[v]++; count[v] > best {
				best, bestValue = count[v], v
			}
		}
		return quorum.Yes, nil
	}, func(t quorum.Tally) bool {
		switch {
		case best >= e.quorum: // a leader
			return true
		case t.Yes+t.Pending < e.quorum: // too few can answer
			return true
		case best+t.Pending >= e.quorum: // a leader is still possible
			return false
		}
		return t.Yes >= e.quorum // no leader, as a majority says
	})
	switch {
	case best >= e.quorum && !testhooks.LeaderSeesNone.Load():
		var l Leader
		if err := json.Unmarshal([]byte(bestValue), &l); err != nil || l.Term == "" {
			return Leader{}, fmt.Errorf("election: identity key %s holds a value this package did not write: %q", e.identityKey(0), bestValue)
		}
		return l, nil
	case t.Yes < e.quorum:
		return Leader{}, noQuorum(fmt.Sprintf("%d of %d nodes answered, %d needed", t.Yes, len(e.nodes), e.quorum), e.nodeErrors(t))
	}
	return Leader{}, ErrNoLeader
}

// announce publishes a leadership change on every node, best effort: the
// message only prompts observers to read the leader again, and Observe
// also polls. It returns once a majority has it (or cannot).
func (e *Election) announce(ctx context.Context, what string) {
	ctx = context.WithoutCancel(ctx)
	r := holder.Start(e.hn, ctx, false, func(ctx context.Context, _ int, n redis.UniversalClient, _ int64) (int64, error) {
		return n.Publish(ctx, e.Channel(), what).Result()
	})
	if t := r.Collect(ctx, holder.Answered, quorum.Majority); !t.Quorum() {
		e.warn(ctx, "announcement published on too few nodes", errors.Join(e.nodeErrors(t)...))
	}
}
