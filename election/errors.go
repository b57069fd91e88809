package election

import (
	"errors"
	"fmt"

	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

var (
	// ErrNoLeader means a majority of nodes answered and no leader is known
	// to a majority of them: none was elected, the last one resigned, or its
	// lease expired. Leader returns it; compare ErrNoQuorum (joined with
	// *redlock.NodeError), where too few nodes answered to tell.
	ErrNoLeader = errors.New("election: no leader")

	// ErrNotLeader means the term had already ended by loss (or by Close of
	// the redlock Client) when Resign was called: there was nothing left to
	// hand over. It is joined with the cause, e.g. redlock.ErrLockLost.
	ErrNotLeader = errors.New("election: not the leader")
)

// ErrNoQuorum is redlock.ErrNoQuorum: too few nodes answered. Errors that
// match it are joined with one *redlock.NodeError per failed node.
var ErrNoQuorum = redlock.ErrNoQuorum

// invalid wraps redlock.ErrInvalidArgument, so that one sentinel matches bad
// input in both packages.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: election: %s", redlock.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// nodeErrors returns one *redlock.NodeError per failed node of t.
func (e *Election) nodeErrors(t quorum.Tally) []error {
	var errs []error
	for i, err := range t.Errs {
		if err == nil {
			continue
		}
		if ne := (*redlock.NodeError)(nil); !errors.As(err, &ne) {
			err = &redlock.NodeError{Node: i, Addr: nodeaddr.Of(e.nodes[i]), Err: err}
		}
		errs = append(errs, err)
	}
	return errs
}
