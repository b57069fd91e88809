package node

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// The release of a token (DESIGN step 4), as Run is its rounds: the caller
// says what to send (its release script, given the guard a node must
// leave); the node layer says how it may land. Every release of a token
// goes through Release (a round to every node, or a cleanup of an attempt)
// or Resend (a pipeline of releases to one node), which:
//
//   - register it as a release of the token's keys on each node before it
//     is handed to a goroutine or sent, until it ends (beginRelease), so
//     the Client's next acquire of those keys follows it (Op.Follow);
//   - size the guard it leaves on each node from the token's unanswered
//     requests there (guard): none where every one was answered, else
//     until the latest not-after bound the token's requests can carry
//     there has passed in the node's clock (guardTTL);
//   - send it through the Set's gates, even once two nodes were found to
//     reach one server (a lock granted before must be released);
//   - hand a release the node did not confirm, where it may matter
//     (needsRetry), to the caller's retry loop as a Part.

// Part is a token's release on one node, sent with others in one request
// (Resend): one the node did not confirm (Release's retry),
// or Close's release of a lock still held (Token.Part).
type Part struct {
	Keys  scripts.Keys  // the token's keys on the node
	Guard time.Duration // the guard the release leaves there (0: none)
	Node  int           // the node
	// unsent is set when the release never left the client while a
	// request of the token there may still land: it is needed only if
	// that request left the client, which it tells once it ends (moot).
	unsent *Token
}

// moot reports whether p need not be sent: it never left the client, and
// no request of its token can land on its node any more.
func (p Part) moot() bool { return p.unsent != nil && !p.unsent.unanswered(p.Node) }

// Part returns t's release on node i, with the guard it must leave there.
func (t *Token) Part(i int) Part { return Part{Keys: t.keys[i], Guard: t.guard(i), Node: i} }

// Release sends t's release to every node at once, as one round, and
// returns it; the requests go out even if ctx is done, each bounded by t's
// node timeout. send is the release script on node i, leaving guard (0:
// none). A request the node did not confirm, where it may matter, goes to
// retry.
//
// vote, when set, makes the release a cleanup of t, which was never handed
// out (a failed or refused call's attempt): vote(i, false) is what node i
// answered the call's last round as far as is known now (Pending: not yet,
// or the release must go there anyway: t's queue entry, say); vote(i,
// true) may wait for that answer, at most that round's deadline (so the
// node's release gets a node timeout of its own after it, and the round
// two). A node that refused (No) holds nothing of t unless a request of t
// is unanswered there (holdsNothing): it is skipped, before the round when
// its answer is known, and with every node skipped nothing is sent and
// the round is nil. Nobody need wait for a cleanup: its round ends on the
// Client's goroutines.
func Release(ctx context.Context, t *Token, vote func(i int, wait bool) quorum.Vote, send func(ctx context.Context, i int, s redis.Scripter, guard time.Duration) (bool, error), retry func(Part)) *quorum.Round[bool] {
	timeout := t.timeout
	if vote != nil {
		timeout *= 2
		if testhooks.AbandonNodes(t.n) == 0 {
			return nil // a negative control: the cleanup releases nothing
		}
		left := 0
		for i := range t.n {
			if !t.holdsNothing(i, vote(i, false)) {
				left++
			}
		}
		if left == 0 {
			return nil // refused everywhere, nothing of ours unanswered: a refused TryLock's usual end
		}
	}
	ctx = context.WithoutCancel(ctx)
	dones := make([]func(), t.n)
	for i := range dones {
		if vote == nil || !t.holdsNothing(i, vote(i, false)) {
			dones[i] = t.set.beginRelease(t.keys[i], i)
		}
	}
	return quorum.StartAt(ctx, time.Now(), t.n, timeout, t.sp, func(ctx context.Context, i int) (bool, error) {
		if dones[i] == nil {
			return false, nil // skipped: nothing of ours there
		}
		defer dones[i]()
		if vote != nil {
			if t.holdsNothing(i, vote(i, true)) {
				return false, nil // it refused, and no request of ours unanswered: nothing of ours there
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, t.timeout) // a node timeout of its own, after the wait
			defer cancel()
		}
		if t.closed == nil { // a lock's release, not a linked package's (Linked.Token) of the same key
			testhooks.BeforeReleaseSend(t.keys[i].Lock, i)
		}
		ok, err := call(ctx, t, i, false, func(ctx context.Context, s redis.Scripter) (bool, error) {
			return send(ctx, i, s, t.guard(i)) // the guard it needs there
		})
		if err != nil {
			return false, t.unconfirmed(ctx, i, err, retry)
		}
		return ok, nil
	})
}

// holdsNothing reports whether node i, whose answer to t's last round was
// v, holds nothing of t: it refused, and no request of t is unanswered
// there.
func (t *Token) holdsNothing(i int, v quorum.Vote) bool {
	return v == quorum.No && !t.unanswered(i)
}

// beginRelease registers a release of keys on node i (under each of its
// lock keys: a multi-lock's every resource), before it is handed to a
// goroutine or sent; done ends it. Every release registers it (Release,
// Resend). This Client's next acquire of any of those keys waits on each
// node for the releases registered there before its round was (Op.Follow),
// so that its own leftovers never refuse it: a TryLock right after a
// refused one found the first one's grant still there
// (TestReal_evenNNeedsThreeOfFour, once beside stress-ng).
func (s *Set) beginRelease(keys scripts.Keys, i int) (done func()) {
	locks := keys.LockKeys()
	f := make(chan struct{}) // closed when the release has ended
	s.relMu.Lock()
	if s.releasing == nil {
		s.releasing = make(map[relKey][]chan struct{})
	}
	for _, key := range locks {
		k := relKey{key, i}
		s.releasing[k] = append(s.releasing[k], f)
	}
	s.relMu.Unlock()
	return func() {
		s.relMu.Lock()
		for _, key := range locks {
			k := relKey{key, i}
			fs := s.releasing[k]
			if j := slices.Index(fs, f); j >= 0 {
				fs = slices.Delete(fs, j, j+1)
			}
			if len(fs) == 0 {
				delete(s.releasing, k)
			} else {
				s.releasing[k] = fs
			}
		}
		s.relMu.Unlock()
		close(f)
	}
}

// Resend sends parts, releases on node i, in one request: a pipeline
// (pipeline) of the release script, part j's command built by queue,
// bounded by timeout, through the Set's gates. A part that need not be
// sent any more (it never left the client, and no request of its token
// can land there now) is left out: its command is nil in the result; with
// none left, nothing is sent. Each part sent is registered as a release of
// its keys there while it runs.
func Resend(ctx context.Context, s *Set, i int, parts []Part, timeout time.Duration, queue func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(parts))
	live := make([]int, 0, len(parts))
	for j, p := range parts {
		if p.moot() {
			continue
		}
		live = append(live, j)
		defer s.beginRelease(p.Keys, i)()
		testhooks.BeforeReleaseSend(p.Keys.Lock, i)
	}
	if len(live) == 0 {
		return cmds, nil
	}
	_, err := Call(ctx, s, i, false, timeout, func(ctx context.Context, _ redis.Scripter) (struct{}, error) {
		sent, err := pipeline(ctx, s.Nodes[i].C, len(live), scripts.ReleaseScript, func(p redis.Pipeliner, k int) *redis.Cmd {
			return queue(ctx, p, live[k])
		})
		for k, cmd := range sent {
			cmds[live[k]] = cmd
		}
		return struct{}{}, err
	})
	if err != nil {
		return nil, err
	}
	return cmds, nil
}

// unconfirmed is the error of t's release to node i that failed with err;
// where the node may have it, or a request of t may still land there
// (needsRetry), the release goes to retry, with the guard's lifetime.
func (t *Token) unconfirmed(ctx context.Context, i int, err error, retry func(Part)) error {
	if retry != nil && t.needsRetry(i, err) {
		p := Part{Keys: t.keys[i], Guard: t.guardTTL(), Node: i}
		if unsent(err) {
			p.unsent = t
		}
		retry(p)
	}
	return t.own.Fail(ctx, i, "release", err)
}

// needsRetry reports whether a release to node i that failed with err must
// be sent again: always when the node may have it (a timeout, a broken
// connection), was busy, or answered with an error; when the request never
// left the client (a refused dial), only if a request of the token may
// still land there: nothing else of ours can be on a node we cannot reach.
// A request of the token still in flight there may turn out to have never
// left the client either (a node that refuses every dial fails them all):
// the retry loop asks again (Part.moot).
func (t *Token) needsRetry(i int, err error) bool {
	var re redis.Error
	if errors.Is(err, errBusy) || errors.As(err, &re) || !unsent(err) {
		return true
	}
	return t.unanswered(i)
}

// guard returns how long node i must refuse requests of the token after
// its release: 0 when every request of the token there has been answered
// (none can land later), else the guard's lifetime (see guardTTL).
func (t *Token) guard(i int) time.Duration {
	if t.unanswered(i) {
		return t.guardTTL()
	}
	return 0
}

// guardTTL is how long a release's guard stays: until no request of the
// token can land on a node with its not-after bound still ahead of the
// node's clock (Set.guardLifetime: about a node timeout plus the clock
// estimates' error; twice the TTL for a node that was sent a request
// without a bound). A request that lands later is refused by its bound,
// however late. The guard is a key of its own, so it keeps nobody else
// waiting.
func (t *Token) guardTTL() time.Duration {
	if testhooks.SkipReleaseGuard.Load() {
		return 0 // a negative control of the chaos checker
	}
	return t.set.guardLifetime(t.keys, t.ttl, t.timeout)
}

// unanswered reports whether a request of the token may still land on node
// i: one ended unanswered there, or a registered round's request there
// has not ended (or was not sent yet).
func (g *Token) unanswered(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unsure != nil && g.unsure[i] || g.open != nil && g.open[i] > 0
}
