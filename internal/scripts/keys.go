package scripts

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
