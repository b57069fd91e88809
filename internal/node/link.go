package node

import "time"

// Linked is what a package built on a redlock Client (election, the qlock
// command) uses of it: the Client's node layer, so that its requests pass
// the same gates (a node down or stuck, the in-flight cap, the identity
// check) and count in the same health; and an owner for its requests, so
// that the Client's Close waits for them as it waits for its own.
type Linked struct {
	// Set is the Client's nodes, in the order given to it: Call runs a
	// request on one with the Client's gates, Set.Gate gives them for a
	// request sent on a client of its own.
	Set *Set
	// Go runs f on a goroutine the Client owns: Close waits for it, at most
	// timeout (which f must keep to) plus a short grace. It returns an
	// error matching redlock.ErrClosed, and does not run f, once Close has
	// begun.
	Go func(timeout time.Duration, f func()) error
}

// Link returns the Linked of a *redlock.Client. Package redlock sets it
// (in its init), so that packages of this module reach a Client's node
// layer without exported plumbing that users should not call; it is nil
// only if package redlock is not linked in, which cannot be for a caller
// holding a *redlock.Client.
var Link func(client any) Linked
