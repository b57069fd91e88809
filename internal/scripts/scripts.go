// Package scripts holds the Lua scripts that touch lock keys, and their Go
// wrappers. Every script checks ownership atomically on the node; no lock key
// is ever deleted or re-armed by a plain command.
//
// The wrappers run a script as EVALSHA, and as EVAL when the node answers
// NOSCRIPT (after a restart or SCRIPT FLUSH), like [redis.Script.Run]. They take only a
// [redis.Scripter], so tests can wrap a client to inject faults.
package scripts

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed commit.lua
	commitSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed exists.lua
	existsSrc string
	//go:embed holds.lua
	holdsSrc string
	//go:embed leave.lua
	leaveSrc string
	//go:embed fenced_set.lua
	fencedSetSrc string
	//go:embed queue.lua
	queueSrc string // the queue's functions, prepended to acquire and release

	acquire = newScript(queueSrc + acquireSrc)
	commit  = newScript(commitSrc)
	extend  = newScript(extendSrc)
	release = newScript(queueSrc + releaseSrc)
	// releaseTieKeeps is release with the queue's order before issue 20
	// (testhooks.QueueTieKeeps): a caller whose ticket equals the head's
	// goes first, whatever the members, so a yielding waiter keeps its
	// nodes on a tie.
	releaseTieKeeps = newScript(strings.Replace(queueSrc, tieRule, "return ticket <= t", 1) + releaseSrc)
	exists          = newScript(existsSrc)
	holds           = newScript(holdsSrc)
	leave           = newScript(queueSrc + leaveSrc)
	fenced          = newScript(fencedSetSrc)

	// rearm is extend without its heal: it re-arms the key only where it
	// holds the token, and sets nothing where the key is absent (Resume's
	// round: issue 44 item 5).
	rearm = newScript(strings.Replace(extendSrc, healBranch, "", 1))

	// plainSet is the plain lock's scripts; Keys of other kinds carry
	// their own (rwkeys.go).
	plainSet = &scriptSet{acquire: acquire, acquireGuarded: acquireGuarded, extend: extend, release: release}
)

// script is a Lua script whose EVALSHA command head is boxed once.
type script struct {
	*redis.Script
	sha any // the script's SHA1, boxed for the command's arguments
}

func newScript(src string) script {
	s := redis.NewScript(src)
	return script{Script: s, sha: s.Hash()}
}

// processor is the part of a node client the wrappers use: it sends a
// command built here. Every redis.UniversalClient has it.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run runs the script with keys (boxed: numkeys first, then the keys; see
// boxKeys), args and then last, as EVALSHA, and again as EVAL when the node
// answers NOSCRIPT (after a restart or SCRIPT FLUSH), as redis.Script.Run
// does. Unlike Script.Run it does not box the keys and arguments again for
// each request: the keys and arguments of a lock are boxed once, and the
// command is one allocation for all of them. A client without Process gets
// Script.Run. Every script call of a lock goes through it.
func (s script) run(ctx context.Context, c redis.Scripter, keys []string, boxed, args []any, last ...any) *redis.Cmd {
	cmd := make([]any, 0, 2+len(boxed)+len(args)+len(last))
	cmd = append(cmd, "evalsha", s.sha)
	cmd = append(cmd, boxed...)
	cmd = append(cmd, args...)
	cmd = append(cmd, last...)
	p, ok := c.(processor)
	if !ok {
		return s.Run(ctx, c, keys, cmd[2+len(boxed):]...)
	}
	r := redis.NewCmd(ctx, cmd...)
	if len(keys) > 0 {
		r.SetFirstKeyPos(3) // as EvalSha does: Cluster routes by the first key
	}
	if err := p.Process(ctx, r); err != nil && IsNoScript(err) {
		return s.Eval(ctx, c, keys, cmd[2+len(boxed):]...)
	}
	return r
}

// numKeys are the boxed key counts of the scripts' commands.
var numKeys = [...]any{"0", "1", "2", "3", "4", "5", "6", "7", "8"}

// boxKeys returns numkeys and keys, boxed once for every request that
// sends them.
func boxKeys(keys []string) []any {
	b := make([]any, 1+len(keys))
	b[0] = numKeys[len(keys)]
	for i, k := range keys {
		b[1+i] = k
	}
	return b
}

// ms converts a TTL to whole milliseconds for PX/PEXPIRE, never below 1
// (PX 0 is an error).
func ms(d time.Duration) int64 {
	if m := d.Milliseconds(); m > 0 {
		return m
	}
	return 1
}

// Keys names the keys of one lock on one node. Build it with NewKeys, which
// prepares the KEYS lists once for every script call of the lock.
type Keys struct {
	Lock  string // holds the owner's token, with a TTL
	Guard string // set by our release: requests of ours landing later set nothing
	Queue string // waiting members by ticket
	Lapse string // the old form's lapse deadlines (written only while an old version queues here: see queue.lua)
	Fence string // the fence counter; "" when fencing is off
	acq   []string
	ext   []string
	rel   []string
	com   []string
	// The same, boxed once for the commands, each behind its count.
	acqv, extv, relv []any
	// set is the scripts of this kind of lock: plainSet, or a read-write
	// or multi-resource lock's (rwkeys.go). A Keys not made by one of the
	// New…Keys functions has none, and runs no script.
	set *scriptSet
}

// The suffixes of a lock's other keys, after the lock key. GuardSuffix is
// followed by the token. They share the lock key's hash tag, so one script
// can touch them all on a Cluster node.
const (
	GuardSuffix = ":released:"
	QueueSuffix = ":queue"
	LapseSuffix = ":queue:lapse"
)

// NewKeys returns the keys of the lock held by token: fence is "" when
// fencing is off.
func NewKeys(lock, fence, token string) Keys {
	k := Keys{Lock: lock, Guard: lock + GuardSuffix + token, Queue: lock + QueueSuffix, Lapse: lock + LapseSuffix, Fence: fence, set: plainSet}
	k.rel = []string{k.Lock, k.Guard, k.Queue, k.Lapse}
	k.acq, k.ext = k.rel, k.rel[:2]
	if fence != "" {
		k.acq = []string{k.Lock, k.Guard, k.Queue, k.Lapse, k.Fence}
		k.ext = []string{k.Lock, k.Guard, k.Fence}
		k.com = []string{k.Lock, k.Fence}
	}
	// Lock and Guard are boxed once for all three lists.
	k.relv = boxKeys(k.rel)
	k.acqv, k.extv = k.relv, []any{numKeys[2], k.relv[1], k.relv[2]}
	if fence != "" {
		f := any(k.Fence)
		k.acqv = []any{numKeys[5], k.relv[1], k.relv[2], k.relv[3], k.relv[4], f}
		k.extv = []any{numKeys[3], k.relv[1], k.relv[2], f}
	}
	return k
}

// AcquireArgs boxes the arguments of Acquire once, for a lock that sends
// them to every node and on every attempt (AcquireWith).
func AcquireArgs(token string, ttl time.Duration, w Waiter, wake string) []any {
	// Not queueing: unused. Boxed as a constant, so TryLock's path
	// allocates nothing for it (a string variable boxed into an any does).
	var attempt any = "0"
	if w.Member != "" {
		a := strconv.FormatInt(w.Attempt, 10)
		if w.Fresh {
			a += "n"
		}
		attempt = a
	}
	return []any{token, ms(ttl), w.Member, w.Ticket, ms(w.Lapse), wake, attempt}
}

// ErrLate is the answer of a node that ran a request after its not-after
// bound (DESIGN step 4) and so changed nothing: the client had stopped
// waiting for it, or its estimate of the node's clock was wrong (a node's
// clock stepped), but read the reply anyway (its timer fired late, on a
// loaded machine). It is no refusal — the script read no key — and it
// matches context.DeadlineExceeded, as the client's own timeout would have
// (redlock reports it as the node's timeout once the deadline has passed).
var ErrLate error = lateError{}

type lateError struct{}

func (lateError) Error() string {
	return "the request reached the node after its deadline (its not-after bound on the node's clock) and changed nothing"
}

func (lateError) Is(target error) bool { return target == context.DeadlineExceeded }

// AcquireWith is Acquire with arguments from AcquireArgs and a not-after
// bound: the node's TIME, in ms, past which the request changes nothing
// and fails with ErrLate (DESIGN step 4: the client no longer waits for it
// then). nil or 0 sends no bound. The bound is read when the command is written,
// so *notAfter must not change until the call returns; a pointer (not a
// boxed int64) lets a round keep the bounds of all its nodes in one slice.
func AcquireWith(ctx context.Context, c redis.Scripter, k Keys, args []any, notAfter *int64) (bool, int64, error) {
	s := k.set.acquire
	v, err := s.run(ctx, c, k.acq, k.acqv, args, notAfter).Result()
	if err != nil {
		return false, 0, err
	}
	ok, fence, young, err := parseAcquire(v)
	if young {
		return false, 0, fmt.Errorf("scripts: acquire returned %v", v)
	}
	return ok, fence, err
}

// lateAcquire is the acquire scripts' reply past the not-after bound (see
// acquire.lua): -2, or {-2, fence counter}.
const lateAcquire = -2

// parseAcquire reads the reply of the acquire script: 1 or 0, or {1 or 0,
// fence counter}, or from the guarded variant {-1, uptime} (young); -2 or
// {-2, n} is ErrLate.
func parseAcquire(v any) (ok bool, n int64, young bool, err error) {
	switch v := v.(type) {
	case int64:
		switch v {
		case 0, 1:
			return v == 1, 0, false, nil
		case lateAcquire:
			return false, 0, false, ErrLate
		}
	case []any:
		if len(v) == 2 {
			g, ok1 := v[0].(int64)
			n, ok2 := v[1].(int64)
			switch {
			case ok1 && ok2 && g == -1:
				return false, n, true, nil
			case ok1 && ok2 && g == lateAcquire:
				return false, 0, false, ErrLate
			case ok1 && ok2 && (g == 0 || g == 1):
				return g == 1, n, false, nil
			}
		}
	}
	return false, 0, false, fmt.Errorf("scripts: acquire returned %v", v)
}

// Released is what a release did with the lock key on one node.
type Released int8

// The outcomes of Release.
const (
	NotOurs    Released = iota // the key did not hold our token
	Deleted                    // deleted: nobody was queued
	HandedOver                 // set to the first waiter's token, who was told
	Kept                       // yielding: nobody before us in the queue, the key stays ours
)

// ReleaseWith is Release with arguments from ReleaseArgs.
func ReleaseWith(ctx context.Context, c redis.Scripter, k Keys, args []any) (Released, error) {
	s := k.set.release
	if s == release && testhooks.QueueTieKeeps.Load() {
		s = releaseTieKeeps // a negative control
	}
	return parseReleased(s.run(ctx, c, k.rel, k.relv, args).Int64())
}

// tieRule is the line of queue.lua that breaks a tie of tickets by member.
const tieRule = "return ticket < t or (ticket == t and bytesLess(member, head))"

// ReleaseArgs boxes the arguments of Release once, for a lock that sends
// them to every node (ReleaseWith, ReleaseCmd).
func ReleaseArgs(token string, guard time.Duration, r Waiter, yield bool, wake string) []any {
	g := int64(0)
	if guard > 0 {
		g = ms(guard)
	}
	ticket := ""
	if yield {
		ticket = strconv.FormatInt(r.Ticket, 10)
	}
	var at any = "0 0" // no member: unused (a boxed constant: no allocation)
	if r.Member != "" {
		at = strconv.FormatInt(r.Attempt, 10) + " " + strconv.FormatInt(r.Ticket, 10)
	}
	return []any{token, g, r.Member, wake, ticket, ms(r.Lapse), at}
}

func parseReleased(n int64, err error) (Released, error) {
	if err != nil {
		return NotOurs, err
	}
	if n == -1 {
		return NotOurs, ErrLate // a yield past its not-after bound: it changed nothing
	}
	if n >= 0 && n <= 3 {
		return Released(n), nil
	}
	return NotOurs, fmt.Errorf("scripts: release returned %d", n)
}
