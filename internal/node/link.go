package node

import "time"

// Linked is what a package built on a redlock Client (election, the qlock
// command) uses of it: the Client's node layer, so that its requests pass
// the same gates (a node down or stuck, the in-flight cap, the identity
// check) and count in the same health; and an owner for its requests, so
// that the Client's Close waits for them as it waits for its own.
type Linked struct {
	// Set is the Client's nodes, in the order given to it: Call runs a
	// request on one with the Client's gates, Set.gate gives them for a
	// request sent on a client of its own.
	Set *Set
	// Go runs f on a goroutine the Client owns: Close waits for it, at most
	// timeout (which f must keep to) plus a short grace. It returns an
	// error matching redlock.ErrClosed, and does not run f, once Close has
	// begun.
	Go func(timeout time.Duration, f func()) error
	// NodeTimeout is the node timeout of a lock the Client takes with the
	// per-call options given to Link.
	NodeTimeout time.Duration
}

// Key is the first argument of redlock's Client.Link: a type internal to
// this module, so that only its packages can call that method.
type Key struct{ _ [0]func() }
