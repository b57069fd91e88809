package redlock

import (
	"errors"
	"fmt"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

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
