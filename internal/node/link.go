package node

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// Linked is what a package built on a redlock Client (election, the qlock
// command) uses of it: the Client's node layer, so that its requests pass
// the same gates (a node down or stuck, the in-flight cap, the identity
// check), count in the same health and are bounded on the same clocks; and
// tokens whose requests run on goroutines the Client owns, so that the
// Client's Close waits for them as it waits for its own (Token).
type Linked struct {
	// Set is the Client's nodes, in the order given to it.
	Set     *Set
	timeout time.Duration // the node timeout of the Client's locks with the options given to LinkOf
	goOwned func(timeout time.Duration, f func()) error
}

// Access is how the packages of this module built on a redlock Client
// (election, the qlock command) reach its node layer, with no exported
// name on the Client: the Client embeds the Access made in its constructor
// under an unexported name, which promotes the unexported method LinkOf
// looks for, and only this module can import this package. O is the
// Client's option type; the Access lives as long as the Client.
type Access[O any] struct {
	set         *Set
	lockTimeout func(opts []O) (time.Duration, error)
	goOwned     func(timeout time.Duration, f func()) error
}

// NewAccess returns the Access of the Client of s. lockTimeout returns
// the node timeout of the Client's locks with the per-call options opts,
// or the Client's error when opts are not valid per call; goOwned runs f
// on a goroutine the Client owns, which Close waits for at most timeout
// (which f must keep to) plus a short grace, and returns the Client's
// ErrClosed, not running f, once Close has begun.
func NewAccess[O any](s *Set, lockTimeout func(opts []O) (time.Duration, error), goOwned func(timeout time.Duration, f func()) error) Access[O] {
	return Access[O]{set: s, lockTimeout: lockTimeout, goOwned: goOwned}
}

func (a Access[O]) linked(opts []O) (Linked, error) {
	if a.set == nil {
		return Linked{}, errNoAccess
	}
	timeout, err := a.lockTimeout(opts)
	if err != nil {
		return Linked{}, err
	}
	return Linked{Set: a.set, timeout: timeout, goOwned: a.goOwned}, nil
}

// accessor is what embeds an Access: a redlock Client.
type accessor[O any] interface {
	linked(opts []O) (Linked, error)
}

var errNoAccess = errors.New("node: the Client was not made by its constructor")

// LinkOf returns the node layer of c, a redlock Client, as a package built
// on it sees it, whose requests time out where the Client's locks with the
// per-call options opts do; or the Client's error (an invalid argument)
// when opts are not valid per call. It returns an error, and no Linked,
// when c is nil or was not made by its constructor. It does no I/O.
func LinkOf[O any](c accessor[O], opts ...O) (Linked, error) {
	if c == nil || reflect.ValueOf(c).Kind() == reflect.Pointer && reflect.ValueOf(c).IsNil() {
		return Linked{}, errNoAccess
	}
	return c.linked(opts)
}

// Token returns a token of the linked package (an election's) for keys,
// one per node, kept by own under mu: its rounds (Run) and releases
// (Release) go to nodes, clients of the Set's nodes in the same order (a
// client that is not the Set's gets a Node of its own, with the Set's
// gates and clocks), each bounded by timeout (0: the Client's lock's node
// timeout, LockTimeout) and run on a goroutine the Client owns. Once the
// Client is closed, a request sends nothing and fails with its ErrClosed.
func (l Linked) Token(keys []scripts.Keys, timeout time.Duration, nodes []redis.UniversalClient, mu *sync.Mutex, own Owner) *Token {
	if timeout == 0 {
		timeout = l.timeout
	}
	sp := &linkSpawner{goOwned: l.goOwned, timeout: timeout}
	t := l.Set.Token(keys, 0, timeout, mu, sp, own)
	t.closed = sp.refused
	for i, n := range nodes {
		if n != l.Set.Nodes[i].C {
			t.via = make([]*Node, len(nodes))
			for i, n := range nodes {
				nd := newNode(n)
				t.via[i] = &nd
			}
			break
		}
	}
	return t
}

// LockTimeout is the node timeout of the Client's locks with the per-call
// options given to LinkOf: what the linked package's own requests default to
// (Token), and what paces a package that follows a lock's renewals.
func (l Linked) LockTimeout() time.Duration { return l.timeout }

// linkSpawner starts a linked token's requests on goroutines the Client
// owns. Once the Client refuses one (it is closed), f runs on a goroutine
// of its own, where its request fails at once, unsent (refused).
type linkSpawner struct {
	goOwned func(timeout time.Duration, f func()) error
	timeout time.Duration
	closed  atomic.Pointer[error] // the Client's error once it refused one
}

func (sp *linkSpawner) Go(f func()) {
	if sp.closed.Load() == nil {
		err := sp.goOwned(sp.timeout, f)
		if err == nil {
			return
		}
		sp.closed.Store(&err)
	}
	go f()
}

// refused returns the Client's error once it is closed, else nil.
func (sp *linkSpawner) refused(context.Context, int) error {
	if p := sp.closed.Load(); p != nil {
		return neverSent(*p)
	}
	return nil
}
