package libs

import "context"

// RWLocker is a Locker with read-write locks: quorumlock's RLock and WLock
// (issue 24). The other libraries have none, so lockbench's rwlock
// scenario runs quorumlock alone.
type RWLocker interface {
	Locker
	// RLock acquires a read lock, shared with other readers, waiting as
	// Lock does.
	RLock(ctx context.Context, resource string) (Held, error)
	// WLock acquires the write lock, exclusive of readers and writers.
	WLock(ctx context.Context, resource string) (Held, error)
}

var _ RWLocker = quorumlock{}

func (q quorumlock) RLock(ctx context.Context, resource string) (Held, error) {
	l, err := q.c.RLock(ctx, resource)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (q quorumlock) WLock(ctx context.Context, resource string) (Held, error) {
	l, err := q.c.WLock(ctx, resource)
	if err != nil {
		return nil, err
	}
	return l, nil
}
