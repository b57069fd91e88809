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
	"slices"
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
// boxKeys) and args as given, as EVALSHA, and as EVAL when the node answers
// NOSCRIPT (after a restart or SCRIPT FLUSH), like redis.Script.Run. Unlike
// Script.Run it does not box the keys and arguments again for each
// request: the command is the keys and arguments of the lock, boxed once,
// behind the script's head. A client without Process gets Script.Run.
func (s script) run(ctx context.Context, c redis.Scripter, keys []string, boxed []any, args []any, last ...any) *redis.Cmd {
	return s.runCmd(ctx, c, keys, s.evalshaCmd(boxed, args, last...))
}

// runCmd is run with the whole EVALSHA command built already (see
// evalshaCmd): nothing is allocated for it per request.
func (s script) runCmd(ctx context.Context, c redis.Scripter, keys []string, cmd []any) *redis.Cmd {
	p, ok := c.(processor)
	if !ok {
		return s.Run(ctx, c, keys, cmd[2+1+len(keys):]...)
	}
	return s.process(ctx, p, c, keys, cmd)
}

func (s script) process(ctx context.Context, p processor, c redis.Scripter, keys []string, cmd []any) *redis.Cmd {
	r := redis.NewCmd(ctx, cmd...)
	if len(keys) > 0 {
		r.SetFirstKeyPos(3) // as EvalSha does: Cluster routes by the first key
	}
	if err := p.Process(ctx, r); err != nil && IsNoScript(err) {
		return s.Eval(ctx, c, keys, cmd[2+1+len(keys):]...)
	}
	return r
}

// evalshaCmd returns the whole EVALSHA command of s for boxed keys, args
// and then last (one allocation for all of it).
func (s script) evalshaCmd(boxed []any, args []any, last ...any) []any {
	cmd := make([]any, 0, 2+len(boxed)+len(args)+len(last))
	cmd = append(cmd, "evalsha", s.sha)
	cmd = append(cmd, boxed...)
	cmd = append(cmd, args...)
	return append(cmd, last...)
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
	// set is the scripts of this kind of lock; nil: the plain lock's
	// (read-write and multi-resource locks: rwkeys.go).
	set *scriptSet
}

// kind returns the scripts of k's kind of lock.
func (k Keys) kind() *scriptSet {
	if k.set == nil {
		return plainSet
	}
	return k.set
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
	k := Keys{Lock: lock, Guard: lock + GuardSuffix + token, Queue: lock + QueueSuffix, Lapse: lock + LapseSuffix, Fence: fence}
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

// Extended is the outcome of Extend on one node.
type Extended int8

// The outcomes of Extend.
const (
	Refused Extended = iota // another token holds the key, or our release guards it
	Rearmed                 // the key held our token; its TTL was reset
	Healed                  // the key was absent; it was set again with our token
)

// Acquire sets the lock key to token for ttl where it is absent and no
// waiter that comes first is queued, or refreshes it where it already holds
// token — unless token was released on the node (its guard key exists). A
// free key with waiters queued before us goes to the first live one (as a
// release hands it over; wake is from WakeArg). A refused waiter (w.Member
// set) joins the queue, or refreshes its entry's lapse deadline. It reports
// whether the key holds token now, and, with a fence key, the node's fence
// counter (0 without). A key of another type is an error (WRONGTYPE). It
// sends no not-after bound (see AcquireWith).
func Acquire(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, w Waiter, wake string) (bool, int64, error) {
	return AcquireWith(ctx, c, k, AcquireArgs(token, ttl, w, wake), nil)
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
	v, err := k.kind().acquire.run(ctx, c, k.acq, k.acqv, args, notAfter).Result()
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

// CommitHash is the SHA1 of the commit script, which its EVALSHA carries:
// the simulator's fault layer recognizes phase 2 of a fenced acquire by it
// (issue 33: faults aimed at one protocol phase).
func CommitHash() string { return commit.Hash() }

// Commit is phase 2 of a fenced acquire: it raises the fence counter to
// max(counter, t) where the lock key still holds token, and reports whether
// it did.
func Commit(ctx context.Context, c redis.Scripter, k Keys, token string, t int64) (bool, error) {
	n, err := commit.Run(ctx, c, k.com, token, t).Int64()
	return n == 1, err
}

// Extend re-arms the lock key for ttl where it holds token, and sets it
// where it is absent (unless token was released there); with a fence key it
// also raises the counter to t there. It sends no not-after bound.
func Extend(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, t int64) (Extended, error) {
	return PrepareExtend(k, token, ttl, t).Extend(ctx, c, nil)
}

// Prepared is one script call on one node, built once — keys and the
// arguments that stay the same — for a lock that sends it again and again
// (Extend, on every renewal). It is safe for concurrent use.
type Prepared struct {
	s    script
	keys []string
	cmd  []any // the whole EVALSHA command but the not-after bound
}

// PrepareExtend prepares Extend(k, token, ttl, t); run it with
// Prepared.Extend.
func PrepareExtend(k Keys, token string, ttl time.Duration, t int64) Prepared {
	s := k.kind().extend
	return Prepared{s: s, keys: k.ext, cmd: s.evalshaCmd(k.extv, []any{token, ms(ttl), t})}
}

// PrepareRearm prepares an Extend of a plain lock's key that re-arms it
// only where it holds token, and never sets it where it is absent: run it
// with Prepared.Extend, whose outcome is then never Healed. Resume sends
// it, so that a key that expired after Resume read it is not set again
// before a majority confirmed the token in the same round.
func PrepareRearm(k Keys, token string, ttl time.Duration) Prepared {
	return Prepared{s: rearm, keys: k.ext, cmd: rearm.evalshaCmd(k.extv, []any{token, ms(ttl), 0})}
}

// Extend runs a call prepared by PrepareExtend on c, as Extend does, with
// a not-after bound (see AcquireWith; nil or 0: none).
func (p Prepared) Extend(ctx context.Context, c redis.Scripter, notAfter *int64) (Extended, error) {
	cmd := make([]any, len(p.cmd)+1)
	copy(cmd, p.cmd)
	cmd[len(p.cmd)] = notAfter
	return parseExtended(p.s.runCmd(ctx, c, p.keys, cmd).Int64())
}

// ExtendCmd queues Extend on a pipeline, as EVALSHA, with a not-after
// bound (see AcquireWith; nil or 0: none): load the script on the node
// first (Load), or redo the commands that fail with NOSCRIPT after loading
// it. Read the outcome with ExtendResult after Exec.
func ExtendCmd(ctx context.Context, p redis.Pipeliner, k Keys, token string, ttl time.Duration, t int64, notAfter *int64) *redis.Cmd {
	return k.kind().extend.EvalSha(ctx, p, k.ext, token, ms(ttl), t, notAfter)
}

// ExtendResult reads the outcome of a command queued by ExtendCmd.
func ExtendResult(cmd *redis.Cmd) (Extended, error) {
	return parseExtended(cmd.Int64())
}

func parseExtended(n int64, err error) (Extended, error) {
	if err != nil {
		return Refused, err
	}
	switch n {
	case 0, 1, 2:
		return Extended(n), nil
	case -1: // past the not-after bound (extend.lua)
		return Refused, ErrLate
	}
	return Refused, fmt.Errorf("scripts: extend returned %d", n)
}

// Script names a script for Load.
type Script int8

// The scripts a pipeline may need loaded.
const (
	ExtendScript Script = iota
	ReleaseScript
)

// Load loads a script on a node (SCRIPT LOAD), for pipelines of EVALSHA:
// the script of every kind of lock (plain, reader, writer, multi), as one
// pipeline may carry them all.
func Load(ctx context.Context, c redis.Scripter, s Script) error {
	for _, set := range []*scriptSet{plainSet, readSet, writeSet, multiSet} {
		sc := set.extend
		if s == ReleaseScript {
			sc = set.release
		}
		if err := sc.Load(ctx, c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// IsNoScript reports whether err is a node's NOSCRIPT reply.
func IsNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
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

// Release gives up the lock key where it holds token: it hands it to the
// first live waiter queued on the node (for that waiter's reservation; its
// client is told on its channel, with the token and the waiter's attempt:
// see ParseHandoff; wake is from WakeArg), or
// deletes it when nobody waits. A key already gone goes to the first live
// waiter too. Our member (r.Member) leaves the queue in any case. With
// guard > 0 it also sets the token's guard key for guard, whatever the lock
// key holds, so that a request of ours still in flight cannot set the key
// again when it lands (see Acquire, Extend).
//
// Yielding (yield true, a waiter with a minority of grants): the key is
// handed over only to a waiter before (r.Ticket, r.Member) in the order
// (else Kept), and r stays queued.
func Release(ctx context.Context, c redis.Scripter, k Keys, token string, guard time.Duration, r Waiter, yield bool, wake string) (Released, error) {
	return ReleaseWith(ctx, c, k, ReleaseArgs(token, guard, r, yield, wake))
}

// ReleaseWith is Release with arguments from ReleaseArgs.
func ReleaseWith(ctx context.Context, c redis.Scripter, k Keys, args []any) (Released, error) {
	s := k.kind().release
	if s == release && testhooks.QueueTieKeeps.Load() {
		s = releaseTieKeeps // a negative control
	}
	return parseReleased(s.run(ctx, c, k.rel, k.relv, args).Int64())
}

// healBranch is the branch of extend.lua that sets an absent key again;
// rearm is extend.lua without it.
const healBranch = `elseif v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  r = 2
`

// tieRule is the line of queue.lua that breaks a tie of tickets by member.
const tieRule = "return ticket < t or (ticket == t and bytesLess(member, head))"

// ReleaseCmd queues Release on a pipeline, as EVALSHA (see ExtendCmd),
// with arguments from ReleaseArgs (not yielding). Read the outcome with
// ReleaseResult after Exec.
func ReleaseCmd(ctx context.Context, p redis.Pipeliner, k Keys, args []any) *redis.Cmd {
	return k.kind().release.EvalSha(ctx, p, k.rel, args...)
}

// ReleaseResult reads the outcome of a command queued by ReleaseCmd.
func ReleaseResult(cmd *redis.Cmd) (Released, error) {
	return parseReleased(cmd.Int64())
}

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

// Unqueued returns args from ReleaseArgs (not yielding) without the
// member, for a node where no entry of ours can be left: the release then
// does not look for one (see Release).
func Unqueued(args []any) []any {
	a := slices.Clone(args)
	a[2] = ""
	return a
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

// Yield is Release for a waiter giving back the grants of a failed attempt
// (see Release, yield), with its not-after bound in the node's clock (ms; 0:
// none): past it, the node changes nothing and Yield returns ErrLate.
func Yield(ctx context.Context, c redis.Scripter, k Keys, token string, r Waiter, wake string, notAfter int64) (Released, error) {
	args := append(ReleaseArgs(token, 0, r, true, wake), notAfter)
	return ReleaseWith(ctx, c, k, args)
}

// Holds reports whether the lock key of k holds token. It writes nothing.
func Holds(ctx context.Context, c redis.Scripter, k Keys, token string) (bool, error) {
	n, err := holds.Run(ctx, c, []string{k.Lock}, token).Int64()
	return n == 1, err
}

// Leave takes the entries of w.Member out of the queue of k, and does
// nothing else.
func Leave(ctx context.Context, c redis.Scripter, k Keys, w Waiter) error {
	return leave.Run(ctx, c, k.rel, w.Member, w.Ticket).Err()
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

// ms converts a TTL to whole milliseconds for PX/PEXPIRE, never below 1
// (PX 0 is an error).
func ms(d time.Duration) int64 {
	if m := d.Milliseconds(); m > 0 {
		return m
	}
	return 1
}

// ReleaseHash is the SHA1 of the plain lock's release script, which its
// EVALSHA carries: the simulator's fault layer recognises a yield (a
// release with a ticket) by it and by its ticket argument (issue 30 item 5:
// a fault aimed at yields).
func ReleaseHash() string { return release.Hash() }
