package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// Close, and the releases it sends each node in pipelines (DESIGN step 4).

// Close stops every renewal, releases every lock still held (their
// Context is cancelled with cause ErrClosed; OnLost is not called) and the
// releases the Client still retries in the background, waits for the Lost
// hooks and OnLost callbacks still running, however long they take, and
// waits for the Client's other goroutines. A Close called from OnLost does
// not wait for that callback, which is its caller (a hook must not call
// Close: see Hooks). It does not close node clients given to New.
//
// It is idempotent; afterwards every call returns ErrClosed. Every Close
// returns once the first has finished, with the first one's error: the
// errors of releases that failed.
//
// Each node gets its releases in pipelines of 128 (two in flight), the
// nodes in parallel, for as long as it answers them: a node that does not
// answer one within the node timeout plus a short grace (250ms) is left to
// the keys' TTLs, and so are releases that reach the Client after Close
// has drained that node. So Close takes what the answering nodes need for
// K releases each — it grows with K, mostly the client's CPU for the
// pipelines: 100,000 locks on 5 local nodes took 7.1s on a 2-core machine
// (40s at load 8–15), about 14µs per lock per node — plus, for a node that
// does not answer, at most the node timeout and the grace, whatever K is.
// In the same bound it deletes the Client's identity key (a key per node
// that tells two names of one server apart) from every node it sent one
// to, down or not: one that came back moments before Close gets its DEL
// too (TestReal_closeForgetsIdentityOnANodeJustBack), and one that
// refuses connections costs one failed DEL.
func (c *Client) Close() error {
	if onCallback() {
		c.cbs.enterClose()
		defer c.cbs.leaveClose()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.closeDone
		return c.closeErr
	}
	c.closed = true
	close(c.closing)
	locks := c.locks
	c.locks, c.held = nil, nil
	wait := c.maxWait
	deadline := time.Now().Add(wait + closeGrace)
	c.mu.Unlock()

	c.sched.Close()
	ls := make([]*Lock, 0, len(locks))
	for l := range locks {
		l.reportExpiry()
		l.finish(ErrClosed)
		ls = append(ls, l)
	}
	// Per node, pipelines of the releases for as long as the node answers
	// them (however many locks), then the releases still pending there; a
	// node that does not answer within the node timeout and the grace is
	// left to the keys' TTLs (step 4).
	//
	// The identity keys' DELs go out first, beside the releases: each
	// ends within the node timeout, so the wait below, to the same
	// deadline (node timeout and grace), sees them end unless starting
	// them took longer than the grace (sent after the releases, on a
	// loaded machine they were cut off by the deadline and Close returned
	// with them in flight). They get half the grace more: a DEL that
	// first waits for a check in flight, whose reply was lost, to pass its
	// bound (a few ms past that check's node timeout) still has time to
	// go out and come back within the deadline.
	c.set.ForgetIdentity(wait+closeGrace/2, c.wg.Go)
	errs := c.releaseMany(ls, wait+closeGrace)
	// No loss starts after this: the scheduler is closed and every lock
	// still held is closed.
	c.cbs.wait()
	c.wake.close()
	waitTimeout(&c.wg, time.Until(deadline))
	c.rel.stop()
	c.wg.Close()
	for _, o := range c.owned {
		if err := o.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	c.closeErr = errors.Join(errs...)
	close(c.closeDone)
	return c.closeErr
}

// waitTimeout waits for wg, at most d. A request to a client built without
// ContextTimeoutEnabled may outlive its context; Close does not hang on it.
func waitTimeout(wg interface{ Wait() }, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// releaseMany releases locks on every node for Close (step 4): per node,
// pipelines of the release script, closeChunk locks each, one after the
// other for as long as the node answers them, however many locks there
// are; a node that does not answer one within timeout is left to the
// keys' TTLs. After the locks, each node is sent the releases the
// Client's retry loop still had pending for it. Nodes run in parallel.
// Each lock is then decided as by Unlock, and reported to its hooks; the
// errors of locks that too few nodes released are returned.
func (c *Client) releaseMany(locks []*Lock, timeout time.Duration) []error {
	n, k := len(c.nodes), len(locks)
	start := time.Now()
	wasLost := make([]bool, k)
	args := make([]*relArgs, k)
	for j, l := range locks {
		l.mu.Lock()
		wasLost[j] = l.state == stateLost
		l.mu.Unlock()
		args[j] = &relArgs{l: l}
	}
	outs := make([]closeOutcome, n)
	var g errgroup.Group // zero Group: a node that fails stops no other
	for i := range n {
		g.Go(func() error {
			outs[i] = c.closeNode(i, locks, args, timeout)
			return nil
		})
	}
	_ = g.Wait()
	if k == 0 {
		return nil
	}
	elapsed := time.Since(start)
	ctx := context.Background()
	var errs []error
	for j, l := range locks {
		lt := quorum.Tally{Votes: make([]quorum.Vote, n), Errs: make([]error, n), Pending: n, Elapsed: elapsed}
		for i := range n {
			o := &outs[i]
			var err error
			ok := false
			if err = o.err(j); err == nil {
				ok = o.res[j] == scripts.Deleted || o.res[j] == scripts.HandedOver
			}
			vote, verr := voteReleased(i, quorum.Reply[bool]{Val: ok, Err: err})
			lt.Record(i, vote, verr)
		}
		err := l.releaseError(lt)
		if obs := l.cfg.obs; obs != nil {
			if wasLost[j] {
				<-l.lostDone // the Lost hook comes first
			}
			obs.Release(ctx, ReleaseInfo{Lock: l.id, Resource: l.resource, Latency: elapsed, HeldFor: time.Since(l.acquired),
				WasLost: wasLost[j], Released: lt.Yes, Err: err, NodeErrors: c.nodeErrors(lt)})
		}
		if err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, fmt.Errorf("release %q: %w", l.resource, err))
		}
	}
	return errs
}

// closeChunk is how many releases Close sends a node in one pipeline, and
// closeDepth how many such pipelines it keeps in flight on one node: a
// chunk is some milliseconds of work (more on a loaded client), so that
// the node timeout bounds one chunk, not all of them, and the node is kept
// busy while the client encodes the next chunk.
const (
	closeChunk = 128
	closeDepth = 2
)

// closeOutcome is what one node did with Close's releases: per lock, the
// release's outcome, or an error (per chunk: the node's; per lock: an
// error reply).
type closeOutcome struct {
	res      []scripts.Released
	errs     map[int]error // error replies, per lock
	chunkErr []error       // per chunk: the node did not answer it (or it was not sent)
}

// err returns the error of lock j's release on the node, nil if released
// or not ours.
func (o *closeOutcome) err(j int) error {
	if err := o.chunkErr[j/closeChunk]; err != nil {
		return err
	}
	return o.errs[j]
}

// closeNode sends node i the releases of locks, chunk after chunk
// (closeDepth at once) for as long as the node answers each within
// timeout, then the releases its retry loop still had pending (step 4). A
// chunk the node does not answer stops the node: the chunks not sent yet
// are left to the keys' TTLs. The loop is stopped first, and waited for
// (its round is bounded by the node timeout) before its releases are
// taken.
func (c *Client) closeNode(i int, locks []*Lock, args []*relArgs, timeout time.Duration) closeOutcome {
	exited := c.rel.stopNode(i)
	chunks := (len(locks) + closeChunk - 1) / closeChunk
	o := closeOutcome{res: make([]scripts.Released, len(locks)), chunkErr: make([]error, chunks)}
	var mu sync.Mutex // protects o.errs and stopped
	var stopped error // the first chunk the node did not answer
	send := func(parts []node.Part, queue func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd) ([]*redis.Cmd, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return c.resend(ctx, i, parts, queue)
	}
	var g errgroup.Group
	g.SetLimit(closeDepth)
	for ch := range chunks {
		g.Go(func() error { // waits for a place: at most closeDepth at once
			mu.Lock()
			err := stopped
			mu.Unlock()
			if err != nil {
				o.chunkErr[ch] = err
				return nil
			}
			lo := ch * closeChunk
			part := locks[lo:min(lo+closeChunk, len(locks))]
			parts := make([]node.Part, len(part))
			for j, l := range part {
				parts[j] = l.tok.Part(i) // with the guard node i needs
			}
			cmds, err := send(parts, func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd {
				return scripts.ReleaseCmd(ctx, p, parts[j].Keys, args[lo+j].forNode(i, parts[j].Guard))
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				o.chunkErr[ch] = err
				if stopped == nil {
					stopped = err
				}
				return nil
			}
			for j, cmd := range cmds {
				r, err := scripts.ReleaseResult(cmd)
				o.res[lo+j] = r
				if err != nil {
					if o.errs == nil {
						o.errs = make(map[int]error)
					}
					o.errs[lo+j] = &NodeError{Node: i, Addr: c.nodes[i].Addr, Err: err}
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	<-exited
	es := c.rel.drain(i)
	for stopped == nil && len(es) > 0 {
		part := es[:min(closeChunk, len(es))]
		es = es[len(part):]
		parts := partsOf(part)
		if _, err := send(parts, func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd {
			return scripts.ReleaseCmd(ctx, p, parts[j].Keys, part[j].args)
		}); err != nil {
			break // left to the keys' TTLs
		}
	}
	return o
}
