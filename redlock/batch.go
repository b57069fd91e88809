package redlock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/renew"
)

// batcher renews the Client's locks in batches (issue: one process holding
// many locks). It is the renew.Batcher of the Client's scheduler.
type batcher struct{ c *Client }

func (b batcher) RenewBatch(ctx context.Context, ts []renew.Target, dues []time.Time) []error {
	locks := make([]*Lock, len(ts))
	for j, t := range ts {
		locks[j] = t.(watch).l.current() // the handle that holds the lease now (cohort.go)
	}
	errs := b.c.extendBatch(ctx, locks, dues)
	for j, err := range errs {
		errs[j] = renewError(err)
	}
	return errs
}

// batchReply is one node's answers for the locks of a batch.
type batchReply struct {
	res  []reply
	errs []error // per lock: an error reply for that lock's script
}

// extendBatch extends locks in one round: per node, one pipeline of the
// extend script for every lock. Each lock is then decided on its own
// exactly as by extend (step 5 and 7): its own majority, its own validity
// from the start of the round, its own loss.
func (c *Client) extendBatch(ctx context.Context, locks []*Lock, dues []time.Time) []error {
	if err := c.begin(); err != nil {
		errs := make([]error, len(locks))
		for j := range errs {
			errs[j] = err
		}
		return errs
	}
	defer c.wg.Done()
	toks, owners := make([]*node.Token, len(locks)), make([]node.Owner, len(locks))
	for j, l := range locks {
		toks[j], owners[j] = l.tok, (*owner)(l)
	}
	// Each lock's round is registered before anything is sent, as extend's
	// (node.Batch); the node layer bounds each request.
	fail := func(ctx context.Context, i int, err error) error {
		return c.nodeError(ctx, i, site{c.cfg.obs, "extend", ""}, err)
	}
	r, live, errs := node.Batch(ctx, toks, owners, node.Op{Name: "extend"}, fail, scripts.ExtendScript, func(ctx context.Context, p redis.Pipeliner, i, j int, notAfter *int64) *redis.Cmd {
		l := locks[j]
		return scripts.ExtendCmd(ctx, p, l.keys[i], l.token, l.cfg.ttl, l.fence, notAfter)
	})
	if r == nil {
		return errs
	}
	n, k, q := len(c.nodes), len(live), c.quorum

	// Per lock and node: the vote and the error, in one flat slice each.
	votes := make([]quorum.Vote, k*n)
	verrs := make([]error, k*n)
	yes := make([]int, k)
	decided := make([]bool, k)
	seen := make([]bool, n)
	answered, undecided := 0, k
	replies := make([]batchReply, n) // per node, once it answered
	classify := func(i int, rep quorum.Reply[[]*redis.Cmd]) (quorum.Vote, error) {
		seen[i] = true
		if rep.Err == nil {
			replies[i] = extendReplies(rep.Val)
		}
		answered++
		for kk := range k {
			v, e := quorum.No, error(nil)
			switch {
			case rep.Err != nil:
				v, e = quorum.Failed, rep.Err
			case replies[i].errs[kk] != nil:
				v, e = quorum.Failed, &NodeError{Node: i, Addr: c.nodes[i].Addr, Err: replies[i].errs[kk]}
			case replies[i].res[kk].ours:
				v = quorum.Yes
				yes[kk]++
			}
			votes[kk*n+i], verrs[kk*n+i] = v, e
			if !decided[kk] && (yes[kk] >= q || yes[kk]+n-answered < q) {
				decided[kk] = true
				undecided--
			}
		}
		if rep.Err != nil {
			return quorum.Failed, rep.Err
		}
		return quorum.Yes, nil
	}
	t := r.Collect(ctx, classify, func(t quorum.Tally) bool { return undecided == 0 || t.Pending == 0 })

	for kk, j := range live {
		lv, le := votes[kk*n:(kk+1)*n], verrs[kk*n:(kk+1)*n]
		healed := 0
		for i := range n {
			if !seen[i] {
				// No reply when the batch was decided: failed for every lock
				// where the round timed out or ctx ended (an error), still
				// pending otherwise — a node the batch stopped waiting for
				// once every lock was decided, as a lock's own round reports
				// it (ExtendInfo.Pending; counted as failed with no error,
				// it read as a margin of zero on healthy nodes).
				lv[i], le[i] = quorum.Pending, nil
				if t.Errs[i] != nil {
					lv[i], le[i] = quorum.Failed, t.Errs[i]
				}
			}
			if lv[i] == quorum.Yes {
				if replies[i].res[kk].healed {
					healed++
				}
			}
		}
		lt := quorum.Counted(lv, le)
		lt.Elapsed = t.Elapsed
		errs[j] = locks[j].settle(ctx, r.Started(), lt, healed, dues[j])
	}
	return errs
}

// extendReplies reads a node's replies to a batch's extend commands
// (node.Batch), one per live lock. Replies that are errors for one lock
// (WRONGTYPE, say) stay that lock's; a connection error failed the node
// for all (the round's error).
func extendReplies(cmds []*redis.Cmd) batchReply {
	out := batchReply{res: make([]reply, len(cmds)), errs: make([]error, len(cmds))}
	for kk, cmd := range cmds {
		e, err := scripts.ExtendResult(cmd)
		out.res[kk], out.errs[kk] = reply{ours: e != scripts.Refused, healed: e == scripts.Healed}, err
	}
	return out
}
