package redlock

import (
	"context"
	"errors"
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
	r, live, errs := node.Batch(ctx, toks, owners, node.Op{Name: "extend"}, fail, func(ctx context.Context, i int, live []int, bounds []int64) (batchReply, error) {
		return c.extendPipeline(ctx, i, locks, live, bounds)
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
	classify := func(i int, rep quorum.Reply[batchReply]) (quorum.Vote, error) {
		seen[i] = true
		answered++
		for kk := range k {
			v, e := quorum.No, error(nil)
			switch {
			case rep.Err != nil:
				v, e = quorum.Failed, rep.Err
			case rep.Val.errs[kk] != nil:
				v, e = quorum.Failed, &NodeError{Node: i, Addr: c.nodes[i].Addr, Err: rep.Val.errs[kk]}
			case rep.Val.res[kk].ours:
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
				if rep, _ := r.Reply(i); rep.Val.res[kk].healed {
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

// extendPipeline sends the extend script for every live lock to node i in
// pipelines, with the not-after bounds node.Batch gave: on a plain node one
// for all, on a Cluster node one per lock (the masters' clocks may
// differ). Replies that are errors for one lock (WRONGTYPE, say) stay that
// lock's; a connection error fails the node for all.
func (c *Client) extendPipeline(ctx context.Context, i int, locks []*Lock, live []int, bounds []int64) (batchReply, error) {
	cmds, err := pipelined(ctx, c.nodes[i].C, len(live), scripts.ExtendScript, func(p redis.Pipeliner, kk int) *redis.Cmd {
		l := locks[live[kk]]
		return scripts.ExtendCmd(ctx, p, l.keys[i], l.token, l.cfg.ttl, l.fence, &bounds[min(kk, len(bounds)-1)])
	})
	if err != nil {
		return batchReply{}, err
	}
	out := batchReply{res: make([]reply, len(live)), errs: make([]error, len(live))}
	for kk, cmd := range cmds {
		e, err := scripts.ExtendResult(cmd)
		out.res[kk], out.errs[kk] = reply{ours: e != scripts.Refused, healed: e == scripts.Healed}, err
	}
	return out, nil
}

// pipelineChunk is the most commands one pipeline carries.
const pipelineChunk = 512

// pipelined sends one script command per item (queue builds item k's) to
// node in pipelines of at most pipelineChunk, all bounded by ctx. Items
// that find the script missing on the node (NOSCRIPT: a restart or SCRIPT
// FLUSH) are sent again once it is loaded. It returns each item's command,
// whose error is that item's error reply; a connection error or timeout
// fails the node for every item.
func pipelined(ctx context.Context, nc redis.UniversalClient, count int, s scripts.Script, queue func(p redis.Pipeliner, k int) *redis.Cmd) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, count)
	todo := make([]int, count)
	for k := range todo {
		todo[k] = k
	}
	for pass := 0; len(todo) > 0; pass++ {
		var again []int
		for lo := 0; lo < len(todo); lo += pipelineChunk {
			part := todo[lo:min(lo+pipelineChunk, len(todo))]
			pipe := nc.Pipeline()
			if s == scripts.ReleaseScript && pass == 0 {
				// A release must land within its node timeout, whatever
				// the node's script cache (scripts.Loading).
				pipe = scripts.Loading(pipe)
			}
			for _, k := range part {
				cmds[k] = queue(pipe, k)
			}
			_, _ = pipe.Exec(ctx)
			for _, k := range part {
				err := cmds[k].Err()
				var re redis.Error
				switch {
				case err == nil:
				case scripts.IsNoScript(err) && pass == 0:
					again = append(again, k)
				case !errors.As(err, &re):
					// The node, not the item: a connection error or
					// timeout. Commands written before it may have landed.
					if lo > 0 || pass > 0 {
						err = node.MayHaveLanded(err)
					}
					return nil, err
				}
			}
		}
		if len(again) > 0 {
			if err := scripts.Load(ctx, nc, s); err != nil {
				return nil, err
			}
		}
		todo = again
	}
	return cmds, nil
}
