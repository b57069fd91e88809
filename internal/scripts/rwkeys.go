package scripts

import (
	_ "embed"
	"strconv"
)

// The scripts of the read-write lock and of the multi-resource lock (issue
// 24 items 1 and 3). A Keys value built by NewReadKeys, NewWriteKeys or
// NewMultiKeys carries its script set, so every wrapper of this package
// (Acquire, Extend, Release and their pipelined and prepared forms) runs
// the right script for it: the callers in redlock do not tell the kinds
// apart.
var (
	//go:embed rw.lua
	rwSrc string
	//go:embed rw_acquire.lua
	rwAcquireSrc string
	//go:embed rw_extend.lua
	rwExtendSrc string
	//go:embed rw_release.lua
	rwReleaseSrc string
	//go:embed multi.lua
	multiSrc string

	readSet  = newRWSet("r", false)
	writeSet = newRWSet("w", false)
	// brokenReadSet grants readers beside a writer: the negative control
	// of the chaos checker (NewBrokenReadKeys).
	// Only its acquire differs: it shares the reader's extend and release
	// (which Load loads for pipelines).
	brokenReadSet = func() *scriptSet {
		b := newRWSet("r", true)
		b.extend, b.release = readSet.extend, readSet.release
		return b
	}()
	multiSet = &scriptSet{
		acquire:        newScript("local OP = 'acquire'\n" + multiSrc),
		acquireGuarded: newScript(guardSrc + "\nlocal OP = 'acquire'\n" + multiSrc),
		extend:         newScript("local OP = 'extend'\n" + multiSrc),
		release:        newScript("local OP = 'release'\n" + multiSrc),
	}
)

// scriptSet is the scripts of one kind of lock. A nil *scriptSet is the
// plain lock's (acquire.lua, extend.lua, release.lua).
type scriptSet struct {
	acquire, acquireGuarded, extend, release script
}

func newRWSet(mode string, ignoreWriter bool) *scriptSet {
	head := "local MODE = '" + mode + "'\nlocal IGNORE_WRITER = " + strconv.FormatBool(ignoreWriter) + "\n" + rwSrc + "\n"
	return &scriptSet{
		acquire:        newScript(head + rwAcquireSrc),
		acquireGuarded: newScript(guardSrc + "\n" + head + rwAcquireSrc),
		extend:         newScript(head + rwExtendSrc),
		release:        newScript(head + rwReleaseSrc),
	}
}

// The suffixes of a read-write lock's keys beside the lock key (sharing its
// hash tag): the live readers, and the waiting calls with their lapses.
const (
	ReadersSuffix  = ":readers"
	RWWaitSuffix   = ":rwwait"
	RWLapseSuffix  = ":rwwait:lapse"
	ReadersMarker  = "quorumlock:readers" // the lock key's value while readers hold it (rw.lua MARKER)
	multiGuardHead = ":released:"
)

// NewReadKeys returns the keys of a reader of the read-write lock on lock,
// holding token: the lock key (MARKER while readers hold it, a writer's
// token while a writer does), the token's guard, the readers, the waiters
// and their lapses. Readers have no fence.
func NewReadKeys(lock, token string) Keys {
	return newRWKeys(readSet, lock, "", token)
}

// NewBrokenReadKeys is NewReadKeys with a reader script that grants
// beside a writer: for negative controls only (testhooks.ReaderIgnoresWriter).
func NewBrokenReadKeys(lock, token string) Keys {
	return newRWKeys(brokenReadSet, lock, "", token)
}

// NewWriteKeys returns the keys of a writer of the read-write lock on lock,
// holding token; fence is "" when fencing is off.
func NewWriteKeys(lock, fence, token string) Keys {
	return newRWKeys(writeSet, lock, fence, token)
}

func newRWKeys(set *scriptSet, lock, fence, token string) Keys {
	k := Keys{Lock: lock, Guard: lock + GuardSuffix + token, Queue: lock + RWWaitSuffix, Lapse: lock + RWLapseSuffix, Fence: fence, set: set}
	all := []string{k.Lock, k.Guard, lock + ReadersSuffix, k.Queue, k.Lapse}
	if fence != "" {
		all = append(all, fence)
		k.com = []string{k.Lock, k.Fence}
	}
	k.acq, k.ext, k.rel = all, all, all
	k.acqv = boxKeys(all)
	k.extv, k.relv = k.acqv, k.acqv
	return k
}

// NewMultiKeys returns the keys of a lock on several resources at once:
// locks are their lock keys (sorted and without duplicates: the caller's
// job), and the guard is the first one's, for token. Keys.Lock is the
// first lock key. A multi-lock has no fence and no queue.
func NewMultiKeys(locks []string, token string) Keys {
	k := Keys{Lock: locks[0], Guard: locks[0] + multiGuardHead + token, set: multiSet}
	all := append(append(make([]string, 0, len(locks)+1), locks...), k.Guard)
	k.acq, k.ext, k.rel = all, all, all
	k.acqv = boxKeysAny(all)
	k.extv, k.relv = k.acqv, k.acqv
	return k
}

// boxKeysAny is boxKeys for any number of keys.
func boxKeysAny(keys []string) []any {
	if len(keys) < len(numKeys) {
		return boxKeys(keys)
	}
	b := make([]any, 1+len(keys))
	b[0] = strconv.Itoa(len(keys))
	for i, k := range keys {
		b[1+i] = k
	}
	return b
}

// LockKeys returns the lock keys k covers: Lock, or every resource's of a
// multi-lock. The caller must not modify the slice: it shares k's lists
// (a release registers its keys on every node, so it allocates nothing).
func (k Keys) LockKeys() []string {
	switch {
	case k.set == multiSet:
		return k.acq[:len(k.acq)-1]
	case len(k.rel) > 0:
		return k.rel[:1:1] // Lock heads a plain or read-write lock's lists
	}
	return []string{k.Lock}
}

// Resources returns how many lock keys k covers: 1, or the resources of a
// multi-lock.
func (k Keys) Resources() int {
	if k.set == multiSet {
		return len(k.acq) - 1
	}
	return 1
}
