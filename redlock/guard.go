package redlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// ErrNodeRestarted means a node has been up for less than the restart guard
// (WithRestartGuard), so its grant does not count. It is the Err of a
// *NodeError, which says the node's uptime; when that node was needed for a
// majority, the call's error matches ErrNoQuorum.
var ErrNodeRestarted = errors.New("redlock: node restarted recently")

// WithRestartGuard protects locks held by others from a node that restarted
// and lost its keys: while a node may have been up for less than maxTTL it
// grants nothing, and its refusal is a *NodeError matching ErrNodeRestarted
// (so a majority that needs it fails with ErrNoQuorum, and Lock retries).
// Without it, a lock held on exactly a majority can be granted again to a
// second client through the restarted node while the first still holds it:
// the hazard the Redlock specification answers with "delayed restarts",
// which this enforces from the client side. Off (0) by default.
//
// maxTTL must be at least the longest TTL that any client uses on the
// resources locked through this Client (the guard cannot know other
// processes' TTLs), and at least this lock's TTL. Nodes report their uptime
// in whole seconds, which may exceed the real uptime by up to a second, so
// maxTTL is rounded up to whole seconds and the reported uptime must exceed
// it. Given per call, it applies to that call only.
//
// Only acquisitions are guarded. Extend and the watchdog still set our key
// again on a restarted node (heal it): our lease was held without a break,
// and the guard kept others from taking that node meanwhile. The uptime is
// read with INFO inside the acquire script, in the same atomic step as the
// grant, so the node's ACL needs +info, and the node must be Redis ≥ 5
// (miniredis has no INFO). A Sentinel failover does not reset uptime: a
// promoted replica that missed the key has been up for long. Nodes that keep
// their data across restarts (appendonly with appendfsync always) need no
// guard. See docs/nodes.md.
func WithRestartGuard(maxTTL time.Duration) Option {
	return optionFunc(func(c *config) { c.restartGuard = maxTTL })
}

// restartGuardError says what a guarded acquire's error means
// (scripts.AcquireGuardedWith): a node too young to grant matches ErrNodeRestarted,
// and a node whose ACL refused INFO says which right it lacks.
func restartGuardError(err error) error {
	if young := (*scripts.Young)(nil); errors.As(err, &young) {
		return fmt.Errorf("%w: %w", ErrNodeRestarted, err)
	} else if scriptRefused(err) {
		return fmt.Errorf("%w (WithRestartGuard reads INFO inside the acquire script: the node's ACL user needs +info)", err)
	}
	return err
}
