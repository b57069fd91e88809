// Package node is the node layer of a redlock Client: what the Client
// knows of each node it sends requests to, and of each request that may
// still land there. Every request of the library goes through it (Run for
// a round of a lock token, Batch for a renewal batch, Release and Resend
// for its releases, Call for the rest, which package redlock's call
// wraps; package election and the qlock command reach it through the Access
// the Client embeds, with LinkOf):
//
//   - health: a node whose last dial failed is down, and one with requests
//     in flight past their deadline is stuck; requests to either fail at
//     once, provably unsent (health.refuse, node.go), instead of queuing in its
//     sockets; a node found down is probed until it answers (Set.probeDown);
//   - the in-flight cap per node;
//   - identity: before a Client's first lock request to a node, a check
//     that it is none of the others under another name (identity.go; the
//     checks of a node list that need no I/O, or only Dial's, are package
//     nodecheck's);
//   - each server's clock (clock.go, guardclock.go): every request's
//     not-after bound in the clock of the server that runs it (a Cluster
//     node's key's master), and how long a release's guard must stay for
//     the bounds sent (Token.guardTTL);
//   - what a failed request may have done (unsent, Answered, neverWrote):
//     it counts as never sent only when it provably wrote no byte; a
//     request of many items (Batch, Resend) is chunked here (pipeline.go),
//     which marks a failure after a chunk was written, so no caller can
//     have it read as never sent;
//   - the round as its unit (round.go: Run, Batch, Op): per lock token
//     (Token), every round registered with its start — so its deadline and
//     its requests' not-after bounds — fixed before any point where it can
//     be delayed, sent after the Client's own releases of the key, each
//     request with its bound; per node, whether a request of the token may
//     still land there (Token, token.go: counted open from the round's
//     registration until the node's request ends, and for good where it
//     ended unanswered); and every release of a token (release.go:
//     Release and Resend), registered before it is sent, with the guard
//     its unanswered requests need (Token.guard, DESIGN step 4).
//
// The package knows nothing of locks: a Token is kept by its Owner (a
// redlock Lock, an election), whose mutex and held check Run takes, so
// that a round is registered in one step with the check that it may
// still send; the caller says what to send (Op and a script call; a
// release's script, given its guard).
package node
